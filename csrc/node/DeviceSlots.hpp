// A node's slots in device memory: each rank's buffer (two halves, as SharedSegment's slots)
// mapped into every peer of the node, so the node algorithm's copies and reductions run on the
// device, reading the peers' buffers directly. A device type provides them through its paths
// (paths/Devices.hpp: DevicePaths::nodeSlots; CUDA: cuda/IpcSlots.cpp, by CUDA IPC). The
// barrier between the ranks stays the host segment's: before it, each rank waits for its own
// queued device work, so its writes are complete when a peer reads them (ordered from the
// host: no kernel ever waits for another process, which is what ranks sharing a GPU need).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <functional>
#include <memory>
#include <string>

#include "mpi/Collectives.hpp"

namespace mpigpu::algo {
class Reducer;
}

namespace mpigpu::node {

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
};

// Collective over `nodeComm`; null with the reason in `why` where this rank could not map its
// peers' buffers (the caller agrees with the other ranks before anyone uses them). `where`: the
// first op's tensors' device (the maker picks its own where that is another type).
using DeviceSlotsMaker = std::function<std::unique_ptr<DeviceSlots>(
    const mpi::Comm& nodeComm, int64_t slotBytes, const at::Device& where, const char* op, int rank,
    std::string* why)>;

}  // namespace mpigpu::node
