// The one table of TORCH_MPIGPU_* settings: name, default, when it is read, meaning. Config.cpp
// parses through it (so a default lives only here); Python reads it through _C.settings()
// (torch_mpi_gpu/config.py, `info`), and docs/settings.md's table is generated from it
// (`python -m torch_mpi_gpu.config --markdown`; a test checks they agree).
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

struct SettingSpec {
  const char* name;
  const char* defaultValue;  // what the parser sees when the variable is unset; "" = no value
  const char* shownDefault;  // how docs/settings.md shows the default when it is not just the value
  ReadAt readAt;
  const char* meaning;  // Markdown, one line
};

const std::vector<SettingSpec>& settings();
// The row of `name`; a name missing from the table is a bug here, reported as such.
const SettingSpec& setting(std::string_view name);
const char* readAtName(ReadAt readAt);
// The settings every rank of a group must share, as lines `NAME=value` in table order (the
// table's default where unset), read now.
std::string sharedSettings();

}  // namespace mpigpu
