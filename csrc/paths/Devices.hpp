// The device seam: how tensors of one device type meet MPI. A device type registers its paths
// once, from its own source file (a static DevicePathsRegistration), and nothing else in mpigpu
// names it: the process group asks PathFactory for an op's buffers by device and use.
//
//   CPU                 built in: the cpu path (paths/OpBuffers.cpp)
//   CUDA                cuda/CudaPaths.cpp, in builds with CUDA sources
//   anything else       via-cpu: copies through host memory (XPU, a PrivateUse1 device, CUDA in a
//                       build without CUDA sources)
//
// A new device type: one file that implements DevicePaths (its OpBuffers, with their link and
// reducer) and registers it; setup.py compiles it.
#pragma once

#include <c10/core/DeviceType.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/Config.hpp"
#include "mpi/Collectives.hpp"
#include "node/DeviceSlots.hpp"
#include "paths/OpBuffers.hpp"

namespace mpigpu::paths {

// What an op does with its buffers. The policy (MPI's collectives or our algorithms) is chosen
// above this layer; the device decides how bytes move for each use.
enum class Use {
  Move,       // data movement and point-to-point: MPI's own calls
  Reduce,     // MPI's own reduction (all_reduce, reduce, reduce_scatter)
  Algorithm,  // our reduction algorithms (algorithms/): buffers, link and reducer of the device
};

// A path's name and why it was chosen (info(), a group's description).
struct PathChoice {
  std::string name;
  std::string reason;
};

// One process group's paths for one device type (it may keep per-group state: comm streams).
class DevicePaths {
 public:
  virtual ~DevicePaths() = default;
  virtual std::shared_ptr<OpBuffers> create(const at::Device& device, Use use) = 0;
  virtual PathChoice choice(Use use) const = 0;
  // Collective over the new group, on every rank, before its first op: a device whose paths
  // take the MPI library's word (device pointers) checks it here and falls back where it does
  // not hold. `anyGpu`: some member has a GPU (agreed over the group). Default: nothing to check.
  virtual void confirm(const mpi::Comm& group, bool anyGpu, const char* op) {}
  // The node algorithm's slots in this device's memory (node/DeviceSlots.hpp); null: none, the
  // node algorithm then serves this device's tensors through host memory or not at all.
  virtual node::DeviceSlotsMaker nodeSlots() const { return nullptr; }
  // The device this rank's ops run on, as its node's peers name it (ranks with the same id share
  // one device: node::Node::sharesDevice); "": unknown.
  virtual std::string nodeDeviceId() const { return ""; }
  // Bytes per MPI call into which this device's paths cut an elementwise slot (all_reduce,
  // reduce, broadcast) for `use`, as a staging pipeline does; 0: whole. Read after confirm().
  virtual int64_t pieceBytes(Use use) const { return 0; }
};

// A group's DevicePaths from its settings; the device's reducer without a group (test hooks).
using DevicePathsFactory = std::function<std::unique_ptr<DevicePaths>(const Config&)>;
using ReducerFactory =
    std::function<std::unique_ptr<algo::Reducer>(c10d::ReduceOp::RedOpType kind)>;
struct DevicePathsRegistration {
  DevicePathsRegistration(c10::DeviceType type, DevicePathsFactory paths, ReducerFactory reducer);
};

// Chooses each op's path and creates its OpBuffers. One per process group, holding the group's
// paths of every registered device type (their per-group state: ops of one group stay ordered on
// a device as they are on the wire) and the group's reused host buffer.
class PathFactory {
 public:
  explicit PathFactory(const Config& config);
  std::shared_ptr<OpBuffers> create(const at::Device& device, Use use = Use::Move);
  // Every device's confirm(), in one order on every rank, then the group's pieces (collective
  // over `group`).
  void confirm(const mpi::Comm& group, bool anyGpu, const char* op);
  // `type`'s node slots, where its paths have them.
  node::DeviceSlotsMaker nodeSlots(c10::DeviceType type) const;
  std::string nodeDeviceId(c10::DeviceType type) const;
  // "cpu tensors cpu, cuda tensors cuda-direct (why), ..., other devices via-cpu"
  std::string describe() const;

 private:
  // The largest pieces any member's device cuts elementwise slots into, per use: every rank cuts
  // the same, so a CPU rank beside a staging GPU rank makes the same MPI calls.
  void agreePieces(const mpi::Comm& group, const char* op);

  std::map<c10::DeviceType, std::unique_ptr<DevicePaths>> devices_;
  std::shared_ptr<HostScratch> hostScratch_;
  int64_t testHostPieceBytes_ = 0;                     // TORCH_MPIGPU_TEST_HOST_PIECE_BYTES
  int64_t movePieceBytes_ = 0, reducePieceBytes_ = 0;  // agreed over the group
};

// The path tensors of `type` take for `use` with these settings, without a group.
PathChoice describePath(c10::DeviceType type, Use use, const Config& config);
// The device's own reducer for our algorithms' local step: the host's for CPU, a registered
// device's own; a ValueError for other types (via-cpu reduces on the host). Needs no MPI.
std::unique_ptr<algo::Reducer> makeReducer(c10::DeviceType type, c10d::ReduceOp::RedOpType kind);

}  // namespace mpigpu::paths
