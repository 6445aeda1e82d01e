// The CUDA reducer: c10d's reduce ops mapped onto our kernels (ReduceKernels.cu), with the checks
// and the device guard on the host side.
#include "cuda/CudaReducer.hpp"

#include <ATen/ops/view_as_real.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/ReduceKernels.hpp"

namespace mpigpu::cuda {
namespace {

Arith arithmeticFor(c10d::ReduceOp::RedOpType kind) {
  switch (algo::arithmeticOf(kind)) {
    case c10d::ReduceOp::SUM: return Arith::kSum;
    case c10d::ReduceOp::PRODUCT: return Arith::kProd;
    case c10d::ReduceOp::MIN: return Arith::kMin;
    case c10d::ReduceOp::MAX: return Arith::kMax;
    case c10d::ReduceOp::BAND: return Arith::kAnd;
    case c10d::ReduceOp::BOR: return Arith::kOr;
    case c10d::ReduceOp::BXOR: return Arith::kXor;
    default: TORCH_CHECK(false, "mpigpu: no CUDA reduction for reduce op ", static_cast<int>(kind));
  }
}

class CudaReducer final : public algo::Reducer {
 public:
  explicit CudaReducer(c10d::ReduceOp::RedOpType kind) : kind_(kind) {}
  void combine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
               double scale) override {
    cuda::combine(dst, a, b, kind_, scale);
  }
  void combineToBoth(const at::Tensor& dst, const at::Tensor& also, const at::Tensor& a,
                     const at::Tensor& b, double scale) override {
    cuda::combine(dst, a, b, kind_, scale, also);
  }

 private:
  const c10d::ReduceOp::RedOpType kind_;
};

}  // namespace

void combine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
             c10d::ReduceOp::RedOpType kind, double scale, const at::Tensor& also) {
  TORCH_CHECK(dst.is_cuda() && a.device() == dst.device() && b.device() == dst.device() &&
                  (!also.defined() || also.device() == dst.device()),
              "mpigpu: CUDA reduction needs its tensors on one CUDA device");
  auto like = [&](const at::Tensor& t) {
    return t.is_contiguous() && t.numel() == dst.numel() && t.scalar_type() == dst.scalar_type();
  };
  TORCH_CHECK(like(dst) && like(a) && like(b) && (!also.defined() || like(also)),
              "mpigpu: CUDA reduction needs contiguous tensors of one dtype and size");
  if (dst.is_complex()) {  // SUM (AVG, PREMUL_SUM) only: pairs of reals
    auto real = [](const at::Tensor& t) {
      return t.defined() ? at::view_as_real(t).view({-1}) : t;
    };
    return combine(real(dst), real(a), real(b), kind, scale, real(also));
  }
  c10::cuda::CUDAGuard guard(dst.device());
  launchCombine(dst, a, b, arithmeticFor(kind), scale, also);
}

std::unique_ptr<algo::Reducer> makeCudaReducer(c10d::ReduceOp::RedOpType kind) {
  return std::make_unique<CudaReducer>(kind);
}

}  // namespace mpigpu::cuda
