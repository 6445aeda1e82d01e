// The one table of TORCH_MPIGPU_* settings: name, default, when it is read, who it is for,
// meaning. Config.cpp parses through it (so a default lives only here); Python reads it through
// _C.settings() (torch_mpi_gpu/config.py, `info`), and the tables of docs/settings.md and
// docs/testing.md are generated from it (`python -m torch_mpi_gpu.info --settings-markdown TIER`;
// a test checks they agree).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mpigpu {

// When a setting takes effect, so users know when changing it still matters. Settings read at
// group creation must be the same on every rank of the group (they choose its collectives),
// checked when the group is made; GroupCreationPerRank ones only shape what each rank does alone.
enum class ReadAt {
  GroupCreation,
  GroupCreationPerRank,
  FirstOp,
  Import,
  Rendezvous,
  UncaughtException,
  Build
};

// Who a setting is for. User: what a user may need to set (a short list, shown first). Tuning:
// sizes and forms with a measured or reasoned default (each row says what set it). Build: read by
// setup.py. Test: hooks for the test suite only (all named TORCH_MPIGPU_TEST_*), documented in
// docs/testing.md, not in the user's table.
enum class Tier { User, Tuning, Build, Test };

struct SettingSpec {
  const char* name;
  const char* defaultValue;  // what the parser sees when the variable is unset; "" = no value
  const char* shownDefault;  // how docs/settings.md shows the default when it is not just the value
  ReadAt readAt;
  const char* meaning;  // Markdown, one line
  Tier tier;
  const char* basis;  // Tuning: what set the default (a measurement and where it is); else ""
};

const std::vector<SettingSpec>& settings();
// The row of `name`; a name missing from the table is a bug here, reported as such.
const SettingSpec& setting(std::string_view name);
const char* readAtName(ReadAt readAt);
const char* tierName(Tier tier);
// The settings every rank of a group must share, as lines `NAME=value` in table order (the
// table's default where unset), read now.
std::string sharedSettings();

}  // namespace mpigpu
