// The CUDA data paths (compiled only in builds with CUDA sources), registered with the device
// seam (paths/Devices.hpp):
//   cuda-direct  device pointers to a CUDA-aware MPI
//   cuda-staged  device -> pinned host -> MPI -> device, pipelined in chunks
//   cuda-algo    our reduction algorithms on device memory: the GPU reduces (ReduceKernels.cu),
//                each message a device pointer or through pinned memory (StagedLink)
// All copies run on the group's comm stream per device, ordered after the caller's stream.
#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>

#include <unordered_map>

#include "cuda/IpcSlots.hpp"
#include "cuda/CudaReducer.hpp"
#include "core/Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Collectives.hpp"
#include "mpi/DirectProbe.hpp"
#include "mpi/Env.hpp"
#include "paths/Devices.hpp"

namespace mpigpu::cuda {
namespace {

using paths::Access;
using paths::Use;

// How an op's CUDA tensors meet MPI.
enum class Mode { Direct, Staged, Algo };

const char* modeName(Mode m) {
  switch (m) {
    case Mode::Direct: return "cuda-direct";
    case Mode::Staged: return "cuda-staged";
    case Mode::Algo: return "cuda-algo";
  }
  return "?";
}

at::Tensor pinnedEmpty(int64_t numel, at::ScalarType dtype) {
  // torch's caching host allocator: blocks are reused, and not before the copies that used them
  // (recorded by copy_ with non_blocking=true) have finished.
  return at::empty({numel}, at::TensorOptions().dtype(dtype).pinned_memory(true));
}

// Our algorithms' messages through pinned host memory, for an MPI that is not CUDA-aware (and
// for small messages, where a device message costs more than two copies): a send copies its
// piece to the host on the comm stream and waits for it; a receive lands on the host and is
// copied to the device on the comm stream, ahead of the kernel that reduces it.
class StagedLink final : public algo::Link {
 public:
  StagedLink(const mpi::Comm& comm, const char* op, c10::cuda::CUDAStream stream)
      : Link(comm, op, [stream] { stream.synchronize(); }) {}

  void allgather(const at::Tensor& in, const at::Tensor& out) override {
    at::Tensor hostIn = pinnedEmpty(in.numel(), in.scalar_type());
    at::Tensor hostOut = pinnedEmpty(out.numel(), out.scalar_type());
    hostIn.copy_(in, /*non_blocking=*/true);
    settle();
    mpi::allgather(comm_, op_, hostIn, hostOut, /*counted=*/false);
    out.copy_(hostOut, /*non_blocking=*/true);
  }

 protected:
  at::Tensor sendBuffer(const at::Tensor& piece) override {
    at::Tensor host = pinnedEmpty(piece.numel(), piece.scalar_type());
    host.copy_(piece, /*non_blocking=*/true);
    settle();
    return host;
  }
  at::Tensor recvBuffer(const at::Tensor& piece) override {
    return pinnedEmpty(piece.numel(), piece.scalar_type());
  }
  void received(const at::Tensor& host, const at::Tensor& piece) override {
    at::Tensor dst = piece;
    dst.copy_(host, /*non_blocking=*/true);
  }
};

// A CUDA graph cannot hold an op that MPI drives from the host: captured, it would run once, at
// capture, and never at replay; and the comm stream's synchronize would invalidate the capture
// and leave that stream joined to it. So the op is refused before anything is queued.
void refuseInsideCapture(const at::Device& device, const char* op, int rank) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err == cudaSuccess && status == cudaStreamCaptureStatusNone) return;
  if (err != cudaSuccess && err != cudaErrorStreamCaptureImplicit) C10_CUDA_CHECK(err);
  (void)cudaGetLastError();  // the query's error is not sticky: leave none behind
  const char* where =
      err == cudaErrorStreamCaptureImplicit
          ? "the current CUDA stream is the legacy default stream, which a capture on another "
            "stream of device "
          : "the current CUDA stream is being captured into a CUDA graph (device ";
  C10_THROW_ERROR(
      Error,
      opMessage(
          op, rank, "cannot run while ", where, static_cast<int>(device.index()),
          err == cudaErrorStreamCaptureImplicit ? " blocks" : ")",
          status == cudaStreamCaptureStatusInvalidated ? ", a capture already invalidated" : "",
          ". mpigpu's ops are driven by MPI from the host, so a graph cannot replay them: "
          "issue collectives and sends/receives outside the captured region (capture the "
          "compute only and run the op between replays; torch.compile without "
          "mode=\"reduce-overhead\")"));
}

class CudaOpBuffers final : public paths::OpBuffers {
 public:
  // `directFromBytes`: our algorithms' messages of ops from this size go as device pointers,
  // smaller ones (or all, at INT64_MAX) through pinned host memory. `eventsAlways`: record the
  // ordering events even where their stream has no work left (CUDA_ORDER_EVENTS=always).
  CudaOpBuffers(Mode mode, at::Device device, c10::cuda::CUDAStream comm, int64_t directFromBytes,
                bool eventsAlways)
      : OpBuffers(modeName(mode), device),
        mode_(mode),
        comm_(comm),
        directFromBytes_(directFromBytes),
        eventsAlways_(eventsAlways) {}

  void issued(const char* op, int rank) override {
    refuseInsideCapture(device_, op, rank);
    // MPI must see everything the caller queued on its current stream up to this point. Where
    // that stream has finished it all (the host knows without a device command), there is
    // nothing to wait for: an event recorded anyway is a command that, on a GPU the ranks share,
    // can take a switch to this process's time slice in the middle of a peer's work (the node
    // leader's next op, issued while its peers copy out the last result).
    recordIfPending(ready_, c10::cuda::getCurrentCUDAStream(device_.index()));
  }

  c10::OptionalStreamGuard enter() override { return c10::OptionalStreamGuard(comm_.unwrap()); }

  void stageIn() override {
    if (ready_.was_marked_for_recording()) ready_.block(comm_.unwrap());
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (mode_ == Mode::Staged && slots_[i].elementwise) continue;  // run() stages it
      prepare(i);
    }
    // MPI is stream-blind: the caller's producers and our copies must have finished before it
    // reads (or overwrites) the memory (unless the algorithm waits itself: deferStartWait).
    if (deferStartWait_) return;
    const auto start = std::chrono::steady_clock::now();
    comm_.synchronize();
    paths::noteStartWaitSince(start);
  }

  void run(size_t slot, c10::function_ref<void(at::Tensor&)> mpiOn) override {
    Slot& s = slots_[slot];
    if (mode_ != Mode::Staged || !s.elementwise) {
      OpBuffers::run(slot, mpiOn);
      return;
    }
    // Pipeline, in the group's pieces (this path's staging chunk, or a member's larger one): all
    // device->host chunk copies are queued at once; MPI works on chunk i as soon as it has
    // arrived, while later chunks are still copying in and earlier ones copy back out.
    at::Tensor& dev = deviceFlat_[slot];
    dev = deviceView(s);  // a non-contiguous write-only tensor is packed needlessly; harmless
    s.mpi = pinnedEmpty(s.numel, s.users[0].scalar_type());
    if (s.numel == 0) {
      mpiOn(s.mpi);
      return;
    }
    const int64_t chunk = pieceNumel(s);
    const int64_t pieces = (s.numel + chunk - 1) / chunk;
    std::vector<c10::Event> arrived;
    if (s.readable()) {
      arrived.reserve(static_cast<size_t>(pieces));
      for (int64_t i = 0; i < pieces; ++i) {
        const int64_t off = i * chunk, n = std::min(chunk, s.numel - off);
        s.mpi.narrow(0, off, n).copy_(dev.narrow(0, off, n), /*non_blocking=*/true);
        arrived.emplace_back(c10::DeviceType::CUDA);
        arrived.back().record(comm_.unwrap());
      }
    }
    for (int64_t i = 0; i < pieces; ++i) {
      const int64_t off = i * chunk, n = std::min(chunk, s.numel - off);
      if (s.readable()) arrived[i].synchronize();
      at::Tensor piece = s.mpi.narrow(0, off, n);
      mpiOn(piece);
      if (s.writable()) dev.narrow(0, off, n).copy_(piece, /*non_blocking=*/true);
    }
  }

  void stageOut() override {
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.writable()) continue;
      if (mode_ != Mode::Staged) {  // the MPI buffer is device memory
        if (!s.aliased) unpackInto(s.mpi, s.users, /*nonBlocking=*/true);
        continue;
      }
      if (s.elementwise) {  // run() already copied the result into the device buffer
        if (!s.aliased) unpackInto(deviceFlat_[i], s.users, true);
        continue;
      }
      at::Tensor adjacent = s.singleContiguous() ? s.users[0].view({-1}) : adjacentView(s);
      if (adjacent.defined()) {
        adjacent.copy_(s.mpi, /*non_blocking=*/true);
      } else {
        at::Tensor dev = at::empty({s.numel}, s.users[0].options());
        dev.copy_(s.mpi, /*non_blocking=*/true);
        unpackInto(dev, s.users, true);
      }
    }
    // Consumers (Work.wait()) order their streams after this; where the comm stream has finished
    // already (the node leader waited for its work before its last barrier, MPI's device copies
    // end with the call), they have nothing to wait for, and no event is queued (see issued).
    // (A future, once asked for, records its own events: c10's CUDA-aware Future.)
    recordIfPending(done_, comm_);
  }

  void release() override {
    OpBuffers::release();
    deviceFlat_.clear();
  }

  std::unique_ptr<algo::Reducer> reducer(c10d::ReduceOp::RedOpType kind) const override {
    return makeCudaReducer(kind);
  }
  std::unique_ptr<algo::Link> link(const mpi::Comm& comm, const char* op,
                                   int64_t opBytes) const override {
    if (opBytes < directFromBytes_) return std::make_unique<StagedLink>(comm, op, comm_);
    // MPI is stream-blind: kernels that produce or still read a piece finish before MPI uses it.
    auto stream = comm_;
    return std::make_unique<algo::Link>(
        comm, op, [stream] { stream.synchronize(); }, /*devicePointers=*/true);
  }

  std::vector<c10::Device> futureDevices() const override { return {device_}; }
  std::optional<c10::Stream> completionStream() const override { return comm_.unwrap(); }
  void orderCurrentStream() const override {
    if (done_.was_marked_for_recording()) {
      done_.block(c10::cuda::getCurrentCUDAStream(device_.index()).unwrap());
    }
  }

 protected:
  void onAdd(Slot& s) override {
    // The comm stream reads and writes these: the caching allocator must not hand their memory to
    // anyone else until the comm stream is done with it, even if the caller frees them earlier.
    for (const auto& u : s.users) {
      if (u.has_storage()) {
        c10::cuda::CUDACachingAllocator::recordStream(u.storage().data_ptr(), comm_);
      }
    }
    deviceFlat_.emplace_back();
  }

 private:
  // Records `event` on `stream` unless the stream has no work left (CUDA_ORDER_EVENTS=auto).
  void recordIfPending(c10::Event& event, const c10::cuda::CUDAStream& stream) const {
    const bool pending = eventsAlways_ || !stream.query();
    if (pending) event.record(stream.unwrap());
    paths::noteOrderEvent(pending);
  }

  // The users as one flat device tensor: the caller's memory when that is possible (one
  // contiguous tensor, or tensors back to back in one storage), else packed on the comm stream.
  static at::Tensor deviceView(Slot& s) {
    if (s.singleContiguous()) {
      s.aliased = true;
      return s.users[0].view({-1});
    }
    at::Tensor adjacent = adjacentView(s);
    s.aliased = adjacent.defined();
    return s.aliased ? adjacent : packUsers(s);
  }

  void prepare(size_t i) {
    Slot& s = slots_[i];
    if (mode_ != Mode::Staged) {  // device memory: the caller's, or packed
      if (s.readable()) {
        s.mpi = deviceView(s);
        return;
      }
      at::Tensor adjacent = s.singleContiguous() ? s.users[0].view({-1}) : adjacentView(s);
      s.aliased = adjacent.defined();
      s.mpi = s.aliased ? adjacent : at::empty({s.numel}, s.users[0].options());
      return;
    }
    s.mpi = pinnedEmpty(s.numel, s.users[0].scalar_type());
    if (s.readable() && s.numel > 0) s.mpi.copy_(deviceView(s), /*non_blocking=*/true);
  }

  const Mode mode_;
  c10::cuda::CUDAStream comm_;
  const int64_t directFromBytes_;
  const bool eventsAlways_;
  c10::Event ready_{c10::DeviceType::CUDA};
  mutable c10::Event done_{c10::DeviceType::CUDA};
  std::vector<at::Tensor> deviceFlat_;  // staged elementwise slots: the device side of the pipe
};

// The group's comm stream per device.
struct GroupStreams {
  std::mutex mutex;
  std::unordered_map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;

  c10::cuda::CUDAStream get(c10::DeviceIndex index) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = streams.find(index);
    if (it == streams.end()) {
      // High priority: the group's staging copies are not queued behind the caller's compute.
      it = streams.emplace(index, c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index))
               .first;
    }
    return it->second;
  }
};

// How CUDA tensors travel with these settings and this MPI (no group needed).
std::pair<Mode, std::string> chooseMode(const Config& config) {
  if (config.cudaAware == CudaAware::DevicePointers) {
    return {Mode::Direct, "TORCH_MPIGPU_CUDA_AWARE=1: device pointers go to MPI"};
  }
  if (config.cudaAware == CudaAware::Staged) {
    return {Mode::Staged, "TORCH_MPIGPU_CUDA_AWARE=0: staged through pinned host memory"};
  }
  const auto& env = mpi::ensureInitialized();
  if (env.cudaAwareRunTime == 1) {
    return {Mode::Direct,
            "the MPI library reports CUDA support at run time "
            "(MPIX_Query_cuda_support / MPIX_GPU_query_support)"};
  }
  if (env.cudaAwareRunTime == 0) {
    return {Mode::Staged,
            "the MPI library reports no CUDA support; staged through "
            "pinned host memory (TORCH_MPIGPU_CUDA_AWARE=1 overrides)"};
  }
  return {Mode::Staged,
          "the MPI library cannot say whether it is CUDA-aware; staged "
          "through pinned host memory (set TORCH_MPIGPU_CUDA_AWARE=1 if it "
          "is)"};
}

// The same for MPI's own reductions, given the mode of the other ops.
std::pair<Mode, std::string> chooseReduceMode(const Config& config, Mode moveMode) {
  if (moveMode != Mode::Direct) return {moveMode, "as the other ops"};
  if (config.cudaReduce == CudaReduce::Direct) return {moveMode, "TORCH_MPIGPU_CUDA_REDUCE=direct"};
  if (config.cudaReduce == CudaReduce::Staged) {
    return {Mode::Staged, "TORCH_MPIGPU_CUDA_REDUCE=staged: staged through pinned host memory"};
  }
  if (mpi::ensureInitialized().libraryVersion.find("Open MPI") != std::string::npos) {
    // Open MPI's coll/cuda copies device buffers to the host and reduces there, one blocking
    // copy after another; our staged pipeline overlaps the copies with MPI (docs/performance.md
    // has the figures).
    return {Mode::Staged,
            "Open MPI reduces device buffers on the host without "
            "overlapping copies; staged through pinned host memory "
            "(TORCH_MPIGPU_CUDA_REDUCE=direct overrides)"};
  }
  return {moveMode, "device pointers go to MPI, which reduces them itself"};
}

// The CUDA-awareness probe's outcome in this process: one probe serves every later group.
struct ProbeMemo {
  std::mutex mutex;
  bool done = false;
  bool ok = true;
  std::string detail;
};
ProbeMemo& probeMemo() {
  static ProbeMemo memo;
  return memo;
}

class CudaPaths final : public paths::DevicePaths {
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();  // messages never direct

 public:
  explicit CudaPaths(const Config& config)
      : chunkBytes_(config.stagingChunkBytes),
        // the library's word, which the probe checks: device pointers by auto, not by the user
        onLibrarysWord_(config.cudaAware == CudaAware::Auto),
        probe_(config.cudaProbe),
        // made on the thread that creates the group: its device is the one the rank chose
        // (the engine thread's current device is always 0)
        callerDevice_(at::hasCUDA() ? c10::cuda::current_device() : 0),
        eventsAlways_(config.cudaOrderEventsAlways),
        streams_(std::make_shared<GroupStreams>()) {
    std::tie(move_, moveWhy_) = chooseMode(config);
    std::tie(reduce_, reduceWhy_) = chooseReduceMode(config, move_);
    // Our algorithms' messages: device pointers need a CUDA-aware MPI; below cudaDirectBytes
    // pinned staging is cheaper.
    algoDirectFrom_ = move_ != Mode::Direct                     ? kNever
                      : config.cudaReduce == CudaReduce::Direct ? 0
                      : config.cudaReduce == CudaReduce::Staged ? kNever
                                                                : config.cudaDirectBytes;
  }

  std::shared_ptr<paths::OpBuffers> create(const at::Device& device, Use use) override {
    const Mode mode = use == Use::Algorithm ? Mode::Algo : use == Use::Reduce ? reduce_ : move_;
    return std::make_shared<CudaOpBuffers>(mode, device, streams_->get(device.index()),
                                           algoDirectFrom_, eventsAlways_);
  }

  // Staged moves and MPI's own reductions go in pipeline pieces; a rank without a GPU has no
  // CUDA tensors to stage.
  int64_t pieceBytes(Use use) const override {
    if (!at::hasCUDA() || use == Use::Algorithm) return 0;
    return (use == Use::Move ? move_ : reduce_) == Mode::Staged ? chunkBytes_ : 0;
  }

  // Where device pointers go to MPI on the library's word, the first group with a GPU checks
  // them (mpi/DirectProbe.hpp); every group of the process then follows that outcome.
  void confirm(const mpi::Comm& group, bool anyGpu, const char* op) override {
    if (!anyGpu) return;  // agreed over the group: no rank probes
    ProbeMemo& memo = probeMemo();
    const bool claims = move_ == Mode::Direct && onLibrarysWord_ && probe_ != CudaProbe::Off;
    int need = 0;
    {
      std::lock_guard<std::mutex> lock(memo.mutex);
      need = claims && !memo.done ? 1 : 0;
    }
    // a rank that has not probed yet brings every rank of the group into the probe
    MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &need, 1, MPI_INT, MPI_MAX, group.handle), op,
                     group.rank);
    if (need) probeOnce(group, claims, op);
    std::lock_guard<std::mutex> lock(memo.mutex);
    if (claims && memo.done && !memo.ok) stage(memo.detail);
  }

  // Slots on the op's GPU; on the caller's for a first op whose tensors were not CUDA.
  node::DeviceSlotsMaker nodeSlots() const override {
    const c10::DeviceIndex caller = callerDevice_;
    return [caller](const mpi::Comm& nodeComm, const node::SlotsSpec& spec, const at::Device& where,
                    const char* op, int rank, std::string* why) {
      const at::Device device = where.is_cuda() ? where : at::Device(at::kCUDA, caller);
      return makeIpcSlots(nodeComm, spec, device, op, rank, why);
    };
  }

  std::string nodeDeviceId() const override {
    return at::hasCUDA() ? gpuIdentity(callerDevice_) : "";
  }

  paths::PathChoice choice(Use use) const override {
    if (use == Use::Move)
      return {modeName(move_),
              moveWhy_ + "; staging pieces of " + std::to_string(chunkBytes_) + " bytes"};
    if (use == Use::Reduce) return {modeName(reduce_), reduceWhy_};
    return {modeName(Mode::Algo),
            "buffers stay on the GPU, which reduces; messages " +
                (algoDirectFrom_ == kNever ? std::string("through pinned host memory")
                 : algoDirectFrom_ == 0    ? std::string("as device pointers")
                                           : c10::str("as device pointers from ", algoDirectFrom_,
                                                      " bytes, through pinned host memory below"))};
  }

 private:
  // Ranks whose tensors would go as device pointers probe with their GPU's memory, the others
  // (no GPU, or staged by their settings) with host memory: every rank takes part.
  void probeOnce(const mpi::Comm& group, bool claims, const char* op) {
    const bool device = claims && at::hasCUDA();
    const at::Device where =
        device ? at::Device(at::kCUDA, c10::cuda::current_device()) : at::Device(at::kCPU);
    const mpi::ProbeOutcome out =
        mpi::probeDirect(group, where, probe_ == CudaProbe::Fail && claims, op);
    const std::string cost = c10::str(static_cast<int64_t>(out.seconds * 1e6), " us");
    ProbeMemo& memo = probeMemo();
    std::lock_guard<std::mutex> lock(memo.mutex);
    memo.done = true;
    memo.ok = out.ok;
    memo.detail = out.detail;
    if (out.ok) {
      mpi::recordProbe(c10::str("passed: ", out.detail, " (", cost, ", once per process)"));
      return;
    }
    const std::string fix = mpi::cudaSupportFix(mpi::ensureInitialized().libraryVersion);
    mpi::recordProbe(c10::str("failed: ", out.detail,
                              "; CUDA tensors are staged through pinned "
                              "host memory (",
                              cost, ")"));
    // one warning for the job (rank 0), and the details from the rank that saw them
    const bool sawIt = out.detail.rfind(c10::str("rank ", group.rank, ":"), 0) == 0;
    if (group.rank != 0 && !sawIt) return;
    LOG(WARNING) << "mpigpu " << op << " [rank " << group.rank
                 << "]: the MPI library reports CUDA support, but device buffers came back wrong "
                    "in mpigpu's probe ("
                 << out.detail << "). CUDA tensors are staged through pinned host memory. To pass "
                 << "device pointers: " << fix
                 << " (TORCH_MPIGPU_CUDA_AWARE=1 forces them; TORCH_MPIGPU_CUDA_PROBE=off skips "
                    "this check).";
  }

  // The probe failed: everything through pinned host memory, as for a library that says no.
  void stage(const std::string& why) {
    move_ = reduce_ = Mode::Staged;
    moveWhy_ = c10::str(
        "the MPI library reports CUDA support, but mpigpu's probe saw wrong "
        "bytes (",
        why, "); staged through pinned host memory");
    reduceWhy_ = "as the other ops";
    algoDirectFrom_ = kNever;
  }

  const int64_t chunkBytes_;
  const bool onLibrarysWord_;
  const CudaProbe probe_;
  const c10::DeviceIndex callerDevice_;
  Mode move_ = Mode::Staged, reduce_ = Mode::Staged;
  std::string moveWhy_, reduceWhy_;
  int64_t algoDirectFrom_ = 0;
  const bool eventsAlways_;
  std::shared_ptr<GroupStreams> streams_;
};

const paths::DevicePathsRegistration registered(
    c10::DeviceType::CUDA, [](const Config& config) { return std::make_unique<CudaPaths>(config); },
    [](c10d::ReduceOp::RedOpType kind) { return makeCudaReducer(kind); });

}  // namespace

}  // namespace mpigpu::cuda
