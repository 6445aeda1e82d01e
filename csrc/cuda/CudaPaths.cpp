#include "cuda/CudaPaths.hpp"

#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <mutex>

#include "cuda/ReduceKernels.hpp"
#include "mpi/Collectives.hpp"
#include <unordered_map>

namespace mpigpu::cuda {
namespace {

using paths::Access;
using paths::PathKind;

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

class CudaOpBuffers final : public paths::OpBuffers {
 public:
  CudaOpBuffers(PathKind kind, at::Device device, c10::cuda::CUDAStream comm, int64_t chunkBytes)
      : OpBuffers(kind, device), comm_(comm), chunkBytes_(std::max<int64_t>(chunkBytes, 1)) {}

  void issued() override {
    // MPI must see everything the caller queued on its current stream up to this point.
    ready_.record(c10::cuda::getCurrentCUDAStream(device_.index()).unwrap());
  }

  c10::OptionalStreamGuard enter() override { return c10::OptionalStreamGuard(comm_.unwrap()); }

  void stageIn() override {
    if (ready_.was_marked_for_recording()) ready_.block(comm_.unwrap());
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (kind_ == PathKind::CudaStaged && slots_[i].elementwise) continue;  // run() stages it
      prepare(i);
    }
    // MPI is stream-blind: the caller's producers and our copies must have finished before it
    // reads (or overwrites) the memory.
    comm_.synchronize();
  }

  void run(size_t slot, const std::function<void(at::Tensor&)>& mpiOn) override {
    Slot& s = slots_.at(slot);
    if (kind_ != PathKind::CudaStaged || !s.elementwise) {
      mpiOn(s.mpi);
      return;
    }
    // Pipeline: all device->host chunk copies are queued at once; MPI works on chunk i as soon as
    // it has arrived, while later chunks are still copying in and earlier ones copy back out.
    at::Tensor& dev = deviceFlat_[slot];
    dev = deviceView(s);  // a non-contiguous write-only tensor is packed needlessly; harmless
    s.mpi = pinnedEmpty(s.numel, s.users[0].scalar_type());
    if (s.numel == 0) {
      mpiOn(s.mpi);
      return;
    }
    const int64_t chunk = std::max<int64_t>(1, chunkBytes_ / s.users[0].element_size());
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
      if (kind_ != PathKind::CudaStaged) {  // the MPI buffer is device memory
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
    // Consumers (Work.wait(), the future) order their streams after this.
    done_.record(comm_.unwrap());
  }

  void release() override {
    OpBuffers::release();
    deviceFlat_.clear();
  }

  std::unique_ptr<algo::Reducer> reducer(c10d::ReduceOp::RedOpType kind) const override {
    return makeCudaReducer(kind);
  }
  std::unique_ptr<algo::Link> link(const mpi::Comm& comm, const char* op,
                                   bool staged) const override {
    if (staged) return std::make_unique<StagedLink>(comm, op, comm_);
    // MPI is stream-blind: kernels that produce or still read a piece finish before MPI uses it.
    auto stream = comm_;
    return std::make_unique<algo::Link>(comm, op, [stream] { stream.synchronize(); });
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
    if (kind_ != PathKind::CudaStaged) {  // device memory: the caller's, or packed
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

  c10::cuda::CUDAStream comm_;
  const int64_t chunkBytes_;
  c10::Event ready_{c10::DeviceType::CUDA};
  mutable c10::Event done_{c10::DeviceType::CUDA};
  std::vector<at::Tensor> deviceFlat_;  // staged elementwise slots: the device side of the pipe
};

}  // namespace

// (outside the anonymous namespace: paths/ holds it by its declared name)
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

std::shared_ptr<GroupStreams> createGroupState() { return std::make_shared<GroupStreams>(); }

std::shared_ptr<paths::OpBuffers> createOpBuffers(PathKind kind, const at::Device& device,
                                                  const std::shared_ptr<GroupStreams>& groupState,
                                                  int64_t stagingChunkBytes) {
  return std::make_shared<CudaOpBuffers>(kind, device, groupState->get(device.index()),
                                         stagingChunkBytes);
}

}  // namespace mpigpu::cuda
