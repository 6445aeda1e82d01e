// Every difference between the torch versions mpigpu builds against (pyproject.toml's range), in
// one place. The rest of the code names a feature macro or calls a helper here; it never tests a
// torch version itself. setup.py refuses a torch outside the range before compiling.
#pragma once

#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <string>
#include <vector>

#define MPIGPU_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// torch 2.9: Backend::split (split_group), getBackendOptions and setTimeout are virtual, and
// Backend::Options carries group_name and global_ranks_in_group. Before, split_group served NCCL
// only and a backend had no options of its own to hand out.
#define MPIGPU_TORCH_HAS_SPLIT MPIGPU_TORCH_AT_LEAST(2, 9)
// torch 2.10: Backend::shrink (shrink_group) and Store::listKeys.
#define MPIGPU_TORCH_HAS_SHRINK MPIGPU_TORCH_AT_LEAST(2, 10)

// `override` on what only later torches declare virtual (a plain member function before).
#if MPIGPU_TORCH_AT_LEAST(2, 9)
#define MPIGPU_OVERRIDE_SINCE_2_9 override
#else
#define MPIGPU_OVERRIDE_SINCE_2_9
#endif
#if MPIGPU_TORCH_AT_LEAST(2, 10)
#define MPIGPU_OVERRIDE_SINCE_2_10 override
#else
#define MPIGPU_OVERRIDE_SINCE_2_10
#endif
// torch 2.15: Backend::startTimeEstimate/endTimeEstimate (bound as _start_time_estimate and
// _end_time_estimate on every backend; before, torch bound them on NCCL's class only).
#if MPIGPU_TORCH_AT_LEAST(2, 15)
#define MPIGPU_OVERRIDE_SINCE_2_15 override
#else
#define MPIGPU_OVERRIDE_SINCE_2_15
#endif

namespace mpigpu::compat {

// The flight-recorder dump's key for the communication library's version (torch 2.9 renamed it).
inline const char* flightRecorderLibVersionKey() {
  return MPIGPU_TORCH_AT_LEAST(2, 9) ? "comm_lib_version" : "nccl_version";
}

// The group name a split's options ask for ("" where torch's options carry none).
inline std::string groupName(const c10d::Backend::Options& opts) {
#if MPIGPU_TORCH_HAS_SPLIT
  return opts.group_name;
#else
  return {};
#endif
}

// Names the group and its members in options handed to torch (kept only where torch has them).
inline void describeGroup(c10d::Backend::Options& opts, const std::string& name,
                          const std::vector<int>& globalRanks) {
#if MPIGPU_TORCH_HAS_SPLIT
  opts.group_name = name;
  opts.global_ranks_in_group.assign(globalRanks.begin(), globalRanks.end());
#endif
}

}  // namespace mpigpu::compat
