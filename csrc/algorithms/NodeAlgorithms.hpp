// The node-aware algorithms (the table's `node` row): shared memory among a node's ranks and,
// for groups that span nodes, MPI between same-local-index ranks. Each returns false, before
// touching anything, where the group has no segment (the ring runs the op then).
#pragma once

#include "algorithms/Context.hpp"
#include "node/DeviceSlots.hpp"

namespace mpigpu::algo {

bool nodeAllreduce(Context& c, const at::Tensor& buf);
bool nodeReduceScatter(Context& c, const at::Tensor& in, const at::Tensor& out);
bool nodeReduce(Context& c, const at::Tensor& buf, int root);
bool nodeAllgather(Context& c, const at::Tensor& in, const at::Tensor& out);
bool nodeBroadcast(Context& c, const at::Tensor& buf, int root);

// How often this process's node ops waited for the node's peers: barriers in host shared memory
// (with device slots each is a cross-process hand-off: the rank's device work finished first)
// and barriers queued on the device. The benchmark reports them per op.
struct NodeWaits {
  uint64_t host;
  uint64_t device;
  uint64_t hostPeerOnThisCpu;  // host waits for a peer last seen on this CPU: yielded, no spin
  uint64_t singleCopyReads;    // peers' buffers read in place (SharedSegment::readPublished)
  uint64_t settleNs;           // waiting for this rank's own device work before a barrier or MPI
  uint64_t barrierNs;          // waiting at host barriers for the node's peers
};
NodeWaits nodeWaits();

// Tests only (TORCH_MPIGPU_TEST_DEVICE_SLOTS=1): "device" slots that are host shared memory,
// so CPU CI runs the code the CUDA IPC slots share with them (slots as tensors, byte copies as
// tensor copies, settle before each barrier, the agreement on the slots).
node::DeviceSlotsMaker hostDeviceSlotsForTests();

}  // namespace mpigpu::algo
