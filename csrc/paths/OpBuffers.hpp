// The data paths: how one op's tensors meet MPI, one implementation per kind of device.
//
//   cpu          MPI on host memory; contiguous tensors used in place
//   cuda-direct  CUDA-aware MPI on device pointers, ordered against the caller's streams
//   cuda-staged  device -> pinned host -> MPI -> device on a comm stream, pipelined in chunks
//   via-cpu      any other device (XPU, ...; CUDA when built without CUDA sources): host copies
//
// An op adds its tensors as slots (a slot is one flat buffer MPI sees; a list of tensors becomes
// one slot packed back to back), then runs on the engine thread:
//
//   caller thread:  bufs->add(...); bufs->issued();
//   engine thread:  auto guard = bufs->enter(); bufs->stageIn(); <MPI on bufs->mpi(i)>;
//                   bufs->stageOut();
//
// and the Work keeps the OpBuffers to order the caller's streams after the op (wait(), future).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "Config.hpp"
#include "algorithms/Link.hpp"
#include "algorithms/Reducer.hpp"

namespace mpigpu::cuda {
struct GroupStreams;  // cuda/CudaPaths.cpp: a group's comm stream per device
}  // namespace mpigpu::cuda

namespace mpigpu::paths {

// CudaAlgo: CUDA tensors reduced by our algorithms (algorithms/): the op's buffers stay on the
// device, the GPU reduces, and each message goes as a device pointer or through pinned memory.
enum class PathKind { Cpu, CudaDirect, CudaStaged, ViaCpu, CudaAlgo };
const char* pathName(PathKind kind);

// What MPI does with a slot's memory.
enum class Access { Read, ReadWrite, Write };

class OpBuffers {
 public:
  OpBuffers(PathKind kind, at::Device device) : kind_(kind), device_(device) {}
  virtual ~OpBuffers() = default;
  OpBuffers(const OpBuffers&) = delete;
  OpBuffers& operator=(const OpBuffers&) = delete;

  PathKind kind() const { return kind_; }
  at::Device device() const { return device_; }
  // Bytes in all slots (what the op moves on this rank).
  int64_t bytes() const;

  // ---- caller thread ----
  // `users` (all of one dtype, on this op's device) become one flat MPI buffer, back to back in
  // list order. `elementwise` slots (allreduce, broadcast, reduce, send/recv) may be staged in
  // pieces by run() so copies overlap MPI. Returns the slot index.
  size_t add(std::vector<at::Tensor> users, Access access, bool elementwise = false);
  size_t add(const at::Tensor& user, Access access, bool elementwise = false) {
    return add(std::vector<at::Tensor>{user}, access, elementwise);
  }
  // Called once, after the last add(): the op is ordered after what the caller's current stream
  // has queued so far.
  virtual void issued() {}

  // ---- engine thread ----
  // Makes the op's device and comm stream current until the guard goes.
  virtual c10::OptionalStreamGuard enter() { return c10::OptionalStreamGuard(); }
  // Fills the MPI buffers of readable slots (except elementwise ones) and waits until they hold
  // the caller's data: after this MPI may read them.
  virtual void stageIn() = 0;
  // Runs `mpiOn` over an elementwise slot's MPI buffer; paths that stage may call it several
  // times on consecutive pieces, copying in and out around each. Do not call stageIn/stageOut
  // work for this slot yourself.
  virtual void run(size_t slot, const std::function<void(at::Tensor&)>& mpiOn);
  // Writes writable slots back to the caller's tensors (in stream order on devices) and marks
  // the op's end for the consumers.
  virtual void stageOut() = 0;
  // The flat MPI buffer of a slot (valid after stageIn for non-elementwise slots).
  at::Tensor& mpi(size_t slot) { return slots_.at(slot).mpi; }
  // After stageOut: drops the tensors and staging memory (the Work may live much longer).
  virtual void release() { slots_.clear(); }

  // ---- our reduction algorithms (engine thread, inside enter()) ----
  // The local reduction step on this op's memory, and how the algorithm's messages travel
  // (`staged`: device pieces through pinned host memory; host paths ignore it).
  virtual std::unique_ptr<algo::Reducer> reducer(c10d::ReduceOp::RedOpType kind) const {
    return algo::makeHostReducer(kind);
  }
  virtual std::unique_ptr<algo::Link> link(const mpi::Comm& comm, const char* op,
                                           bool staged) const {
    return std::make_unique<algo::Link>(comm, op);
  }

  // ---- Work ----
  // Devices and stream a CUDA-aware future needs (empty / none on host paths).
  virtual std::vector<c10::Device> futureDevices() const { return {}; }
  virtual std::optional<c10::Stream> completionStream() const { return std::nullopt; }
  // Makes the caller's current stream wait for the op's results (after the op completed).
  virtual void orderCurrentStream() const {}

 protected:
  struct Slot {
    std::vector<at::Tensor> users;
    Access access;
    bool elementwise;
    int64_t numel = 0;
    at::Tensor mpi;
    bool aliased = false;   // mpi is the users' own memory: nothing to copy back
    bool deferred = false;  // host path: packed on the engine into the group's reused buffer
    bool readable() const { return access != Access::Write; }
    bool writable() const { return access != Access::Read; }
    // One contiguous tensor whose memory MPI can use as it is (when it lives where MPI reads).
    bool singleContiguous() const { return users.size() == 1 && users[0].is_contiguous(); }
  };
  // Packs the users into one flat tensor / unpacks a flat tensor into the users (on the current
  // stream when on a device; one kernel for several tensors where torch can).
  static at::Tensor packUsers(const Slot& s);
  // When the users already lie back to back in one storage (DDP bucket views, FSDP's flat
  // parameters, slices of one buffer), a flat view of that memory: no packing needed.
  static at::Tensor adjacentView(const Slot& s);
  static void unpackInto(const at::Tensor& flat, const std::vector<at::Tensor>& users,
                         bool nonBlocking);
  // Hook for add(): set up what the path can before the engine runs the op.
  virtual void onAdd(Slot& slot) {}

  const PathKind kind_;
  const at::Device device_;
  std::vector<Slot> slots_;
};

// Chooses each op's path and creates its OpBuffers. One per process group: it owns the group's
// comm streams, so ops of one group stay ordered on the device as they are on the wire.
class PathFactory {
 public:
  struct HostScratch;
  explicit PathFactory(const Config& config);
  ~PathFactory();
  // `reduces`: the op reduces (allreduce, reduce, reduce_scatter), which may take another path.
  std::shared_ptr<OpBuffers> create(const at::Device& device, bool reduces = false);
  // For an op our algorithms reduce: host memory on the host paths, device memory (CudaAlgo) for
  // CUDA tensors in a build with CUDA sources.
  std::shared_ptr<OpBuffers> createForAlgorithm(const at::Device& device);
  // Which path CUDA tensors take, and why (for info() and the debug log).
  PathKind cudaPath() const { return cudaPath_; }
  const std::string& cudaPathReason() const { return cudaReason_; }
  PathKind cudaReducePath() const { return cudaReducePath_; }
  const std::string& cudaReducePathReason() const { return cudaReduceReason_; }

 private:
  Config config_;
  PathKind cudaPath_, cudaReducePath_;
  std::string cudaReason_, cudaReduceReason_;
  std::shared_ptr<cuda::GroupStreams> cudaState_;  // the group's comm stream per device
  std::shared_ptr<HostScratch>
      hostScratch_;  // reused host fusion buffer: used by the thread running the
                     // op (worker, or an inline caller), one op at a time
};

// How CUDA tensors travel with this build, this MPI and this setting (no group needed).
std::pair<PathKind, std::string> chooseCudaPath(const Config& config);
// The same for reductions, given the path of the other ops.
std::pair<PathKind, std::string> chooseCudaReducePath(const Config& config, PathKind cudaPath);

}  // namespace mpigpu::paths
