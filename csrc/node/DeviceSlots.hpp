// A node's slots in device memory: each rank's buffer (two halves, as SharedSegment's slots)
// mapped into every peer of the node, so the node algorithm's copies and reductions run on the
// device, reading the peers' buffers directly. A device type provides them through its paths
// (paths/Devices.hpp: DevicePaths::nodeSlots; CUDA: cuda/IpcSlots.cpp, by CUDA IPC).
//
// The ranks' steps are ordered in one of two ways (TORCH_MPIGPU_NODE_DEVICE_ORDER):
//   host    the host segment's barrier: before it, each rank waits for its own queued device
//           work, so its writes are complete when a peer reads them. No kernel ever waits for
//           another process, which is what ranks sharing one GPU need (a kernel that spins there
//           holds the GPU for a whole time slice).
//   device  flags in the slots' memory: a barrier is a kernel on the op's stream that marks this
//           rank's arrival in every peer's flags and waits for theirs; no host round trip, so
//           the ops queue ahead like NCCL's. What ranks with GPUs of their own need.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/Config.hpp"
#include "mpi/Collectives.hpp"

namespace mpigpu::algo {
class Reducer;
}

namespace mpigpu::node {

using Ordering = NodeDeviceOrder;

// What the node asks of its slots. `Auto`: device flags where every local rank has a GPU of its
// own, the host barrier where some share one.
struct SlotsSpec {
  int64_t slotBytes;
  Ordering ordering;
  int64_t barrierTimeoutMs;  // a device barrier gives up after this long (a peer died or stalled)
  int64_t maxSlotBytes;      // the node grows its slots on demand up to this (node/Node.hpp)
};

class DeviceSlots {
 public:
  virtual ~DeviceSlots() = default;
  virtual at::Device device() const = 0;
  virtual int64_t slotBytes() const = 0;
  // `elems` elements of `dtype` at the start of local rank `rank`'s slot in the current half.
  virtual at::Tensor slot(int rank, at::ScalarType dtype, int64_t elems) const = 0;
  virtual void flip() = 0;
  // Waits for the device work this rank queued (on its current stream) before the barrier.
  virtual void settle() const = 0;
  // The device's reducer, for a rank whose tensors had to be moved to the device.
  virtual std::unique_ptr<algo::Reducer> reducer(c10d::ReduceOp::RedOpType kind) const = 0;

  // ---- device-side ordering ----
  // True: the node op calls barrier() where it would settle and take the host barrier.
  virtual bool ordersOnDevice() const { return false; }
  // Whether the leader form suits these slots when NODE_LEADER is auto: where the ranks' device
  // work runs one process at a time (ordered from the host), one rank reducing for all costs the
  // fewest switches between them.
  bool leaderSuits() const { return !ordersOnDevice(); }
  // Queues a barrier of the node's ranks on the current stream: this rank's writes queued so far
  // are visible to its peers, and its later work starts once every peer has queued (and reached)
  // the same barrier.
  virtual void barrier(const char* op, int rank) {}
  // Throws, naming `op` and `rank`, if an earlier device barrier gave up waiting for a peer (its
  // results are wrong). Reads a word the device wrote; does not wait for the device.
  virtual void checkBarriers(const char* op, int rank) const {}
  // How the ranks' steps are ordered, and why (the group's description).
  virtual std::string ordering() const { return "ordered from the host"; }
  // abort() (any thread): device barriers queued or waiting give up at once instead of waiting
  // for peers that will not come.
  virtual void cancel() {}

  // Before the slots go (node/Node.cpp: retire): waits for all of this process's device work and
  // unmaps the peers' buffers; the node then waits for every rank before any frees its own, so
  // no rank frees memory a peer still reads.
  virtual void release() {}
};

// Collective over `nodeComm`; null with the reason in `why` where this rank could not map its
// peers' buffers (the caller agrees with the other ranks before anyone uses them). `where`: the
// first op's tensors' device (the maker picks its own where that is another type). Every rank
// of a node must choose the same ordering (from what the node's ranks exchanged).
using DeviceSlotsMaker = std::function<std::unique_ptr<DeviceSlots>(
    const mpi::Comm& nodeComm, const SlotsSpec& spec, const at::Device& where, const char* op,
    int rank, std::string* why)>;

}  // namespace mpigpu::node
