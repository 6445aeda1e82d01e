// What profilers see of an op: the backend's event name ("mpigpu:all_reduce", as gloo and NCCL
// name theirs) and, while a profiler runs, the op's communication parameters as torch's
// record_param_comms event (what NCCL records: sizes, dtype, group, ranks, sequence number).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mpigpu {

// Static strings: the Work keeps the pointer.
const char* profilingTitle(c10d::OpType type);

// Whether a profiler (or another RecordFunction callback) is active: torch's own per-thread
// check, a few nanoseconds. (at::hasCallbacks() takes a process-wide lock each call: four of
// those were a tenth of a small op's own cost.)
bool profilerActive();

struct CommsParams {
  const std::string* group = nullptr;  // torch's group name and description (not copied: this
  const std::string* desc = nullptr;   // runs for every op, profiler or not)
  int rank = 0, size = 1;              // in the group
  const std::vector<int>* worldRanks = nullptr;  // the group's members
  const char* op = "";
  uint64_t seq = 0;
  bool p2p = false;
  bool asyncOp = true;
  const std::vector<at::Tensor>* inputs = nullptr;
  const std::vector<at::Tensor>* outputs = nullptr;
  bool profiling = false;  // profilerActive(), read once per op by the caller
};
// Records a record_param_comms event when `p.profiling`.
void recordParamComms(const CommsParams& p);

}  // namespace mpigpu
