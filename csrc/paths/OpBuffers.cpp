#include "paths/OpBuffers.hpp"

#include <c10/util/Exception.h>

#include "mpi/Env.hpp"

#if MPIGPU_WITH_CUDA
#include "cuda/CudaPaths.hpp"
#endif

namespace mpigpu::paths {

const char* pathName(PathKind kind) {
  switch (kind) {
    case PathKind::Cpu: return "cpu";
    case PathKind::CudaDirect: return "cuda-direct";
    case PathKind::CudaStaged: return "cuda-staged";
    case PathKind::ViaCpu: return "via-cpu";
  }
  return "?";
}

size_t OpBuffers::add(std::vector<at::Tensor> users, Access access, bool elementwise) {
  TORCH_INTERNAL_ASSERT(!users.empty(), "mpigpu: a slot needs at least one tensor");
  Slot s;
  s.access = access;
  s.elementwise = elementwise;
  for (const auto& u : users) s.numel += u.numel();
  s.users = std::move(users);
  onAdd(s);
  slots_.push_back(std::move(s));
  return slots_.size() - 1;
}

void OpBuffers::run(size_t slot, const std::function<void(at::Tensor&)>& mpiOn) {
  mpiOn(slots_.at(slot).mpi);
}

at::Tensor OpBuffers::packUsers(const Slot& s) {
  if (s.users.size() == 1) return s.users[0].reshape({-1}).contiguous();
  std::vector<at::Tensor> flat;
  flat.reserve(s.users.size());
  for (const auto& u : s.users) flat.push_back(u.reshape({-1}));
  return at::cat(flat);  // one kernel on devices
}

void OpBuffers::unpackInto(const at::Tensor& flat, const std::vector<at::Tensor>& users,
                           bool nonBlocking) {
  if (users.size() == 1) {
    users[0].copy_(flat.view(users[0].sizes()), nonBlocking);
    return;
  }
  std::vector<at::Tensor> pieces;
  pieces.reserve(users.size());
  int64_t off = 0;
  for (const auto& u : users) {
    pieces.push_back(flat.narrow(0, off, u.numel()).view(u.sizes()));
    off += u.numel();
  }
  at::_foreach_copy_(users, pieces, nonBlocking);  // batched on devices where torch can
}

namespace {

// cpu and via-cpu: host memory, copied on the caller's thread at issue (so a device tensor is
// read in its stream order; .to(kCPU) waits for the producer) and written back on the engine.
class HostOpBuffers final : public OpBuffers {
 public:
  using OpBuffers::OpBuffers;

  void stageIn() override {}

  void stageOut() override {
    for (auto& s : slots_) {
      if (s.writable() && !aliased(s)) unpackInto(s.mpi, s.users, /*nonBlocking=*/false);
    }
  }

 protected:
  void onAdd(Slot& s) override {
    const bool onHost = s.users[0].is_cpu();
    if (onHost && s.singleContiguous()) {
      s.mpi = s.users[0].view({-1});  // MPI uses the caller's memory itself
      return;
    }
    if (!s.readable()) {
      s.mpi = at::empty({s.numel}, s.users[0].options().device(at::kCPU));
      return;
    }
    if (onHost) {
      s.mpi = packUsers(s);
      return;
    }
    std::vector<at::Tensor> host;
    for (const auto& u : s.users) host.push_back(u.to(at::kCPU).reshape({-1}));
    s.mpi = host.size() == 1 ? host[0].contiguous() : at::cat(host);
  }

 private:
  static bool aliased(const Slot& s) {
    return s.users.size() == 1 && s.users[0].is_cpu() && s.mpi.data_ptr() == s.users[0].data_ptr();
  }
};

} // namespace

std::pair<PathKind, std::string> chooseCudaPath(const Config& config) {
#if !MPIGPU_WITH_CUDA
  (void)config;
  return {PathKind::ViaCpu, "this build has no CUDA sources (rebuild with a CUDA torch, CUDA_HOME "
                            "set and TORCH_MPIGPU_WITH_CUDA=1); CUDA tensors are copied through "
                            "the host synchronously"};
#else
  if (config.cudaAware == 1) {
    return {PathKind::CudaDirect, "TORCH_MPIGPU_CUDA_AWARE=1: device pointers go to MPI"};
  }
  if (config.cudaAware == 0) {
    return {PathKind::CudaStaged, "TORCH_MPIGPU_CUDA_AWARE=0: staged through pinned host memory"};
  }
  const auto& env = mpi::ensureInitialized();
  if (env.cudaAwareRunTime == 1) {
    return {PathKind::CudaDirect, "the MPI library reports CUDA support at run time "
                                  "(MPIX_Query_cuda_support / MPIX_GPU_query_support)"};
  }
  if (env.cudaAwareRunTime == 0) {
    return {PathKind::CudaStaged, "the MPI library reports no CUDA support; staged through "
                                  "pinned host memory (TORCH_MPIGPU_CUDA_AWARE=1 overrides)"};
  }
  return {PathKind::CudaStaged, "the MPI library cannot say whether it is CUDA-aware; staged "
                                "through pinned host memory (set TORCH_MPIGPU_CUDA_AWARE=1 if it "
                                "is)"};
#endif
}

PathFactory::PathFactory(const Config& config) : config_(config) {
  std::tie(cudaPath_, cudaReason_) = chooseCudaPath(config_);
#if MPIGPU_WITH_CUDA
  cudaState_ = cuda::createGroupState();
#endif
}

PathFactory::~PathFactory() = default;

std::shared_ptr<OpBuffers> PathFactory::create(const at::Device& device) {
  if (device.is_cpu()) return std::make_shared<HostOpBuffers>(PathKind::Cpu, device);
#if MPIGPU_WITH_CUDA
  if (device.is_cuda() && cudaPath_ != PathKind::ViaCpu) {
    return cuda::createOpBuffers(cudaPath_, device, cudaState_, config_.stagingChunkBytes);
  }
#endif
  return std::make_shared<HostOpBuffers>(PathKind::ViaCpu, device);
}

} // namespace mpigpu::paths
