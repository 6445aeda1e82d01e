// The node algorithm's device-side barrier (node/DeviceSlots.hpp, `device` ordering): one small
// kernel on the op's stream. Every rank of the node owns a flags word per local rank, mapped into
// every peer by CUDA IPC; at barrier k a rank writes k into its word in every peer's flags
// (release, system scope: the writes of the kernels queued before it come first) and waits until
// every peer's word in its own flags reaches k (acquire). The count k lives in device memory and
// is advanced by the kernel itself, so the barrier needs no host arguments that change per call
// (a CUDA graph may capture it). A peer that never arrives (it died, stalled, or issued other
// ops) makes the kernel give up after the timeout and record that in host-mapped memory, which
// the host reads before the next op (IpcSlots::checkBarriers); an aborted group's barriers give
// up at once (a host-mapped word abort() sets).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mpigpu::cuda {

constexpr int kMaxBarrierRanks = 64;  // local ranks a device barrier serves (more: host order)

struct NodeBarrierArgs {
  // local rank j's flags as mapped in this process (this rank's own at its local rank)
  unsigned long long* flags[kMaxBarrierRanks];
  unsigned long long* count;   // this rank's barrier count (device memory)
  unsigned long long* gaveUp;  // host-mapped: the count of the first barrier that timed out
  const unsigned long long* cancelled;  // host-mapped: nonzero once the group is aborted
  int localRank;
  int localSize;
  unsigned long long timeoutNs;
};

// Queues one barrier on `stream`; the launch error, if any.
cudaError_t queueNodeBarrier(const NodeBarrierArgs& args, cudaStream_t stream);

}  // namespace mpigpu::cuda
