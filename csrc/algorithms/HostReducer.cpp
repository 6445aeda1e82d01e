// Host reducer: ATen's CPU kernels are vectorized for every dtype and compute fp16/bf16 in fp32,
// wrap integers and treat bool logically, which is exactly the documented semantics.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <type_traits>

#include "algorithms/Reducer.hpp"

namespace mpigpu::algo {

namespace {

// ATen has no CPU arithmetic for uint16/32/64: plain loops (wrapping, as unsigned types do).
template <typename T>
void unsignedLoop(c10d::ReduceOp::RedOpType kind, T* out, const T* a, const T* b, int64_t n) {
  using W = std::conditional_t<(sizeof(T) > 4), uint64_t, uint32_t>;
  for (int64_t i = 0; i < n; ++i) {
    const T x = a[i], y = b[i];
    switch (kind) {
      case c10d::ReduceOp::SUM: out[i] = static_cast<T>(W{x} + W{y}); break;
      case c10d::ReduceOp::PRODUCT: out[i] = static_cast<T>(W{x} * W{y}); break;
      case c10d::ReduceOp::MIN: out[i] = x < y ? x : y; break;
      case c10d::ReduceOp::MAX: out[i] = x > y ? x : y; break;
      case c10d::ReduceOp::BAND: out[i] = x & y; break;
      case c10d::ReduceOp::BOR: out[i] = x | y; break;
      default: out[i] = x ^ y; break;
    }
  }
}

template <typename T>
bool tryUnsigned(c10d::ReduceOp::RedOpType kind, const at::Tensor& out, const at::Tensor& a,
                 const at::Tensor& b) {
  if (out.scalar_type() != c10::CppTypeToScalarType<T>::value) return false;
  unsignedLoop<T>(kind, out.data_ptr<T>(), a.const_data_ptr<T>(), b.const_data_ptr<T>(),
                  out.numel());
  return true;
}

class HostReducer final : public Reducer {
 public:
  explicit HostReducer(c10d::ReduceOp::RedOpType kind) : kind_(arithmeticOf(kind)) {}

  void combine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
               double scale) override {
    // The buffers may be views of tensors that require grad; this is not a differentiable op.
    at::NoGradGuard noGrad;
    if (dst.is_complex()) {  // SUM (AVG, PREMUL_SUM) only: pairs of reals
      apply(at::view_as_real(dst), at::view_as_real(a), at::view_as_real(b), scale);
      return;
    }
    apply(dst, a, b, scale);
  }

 private:
  void apply(at::Tensor out, const at::Tensor& a, const at::Tensor& b, double scale) {
    if (tryUnsigned<uint16_t>(kind_, out, a, b) || tryUnsigned<uint32_t>(kind_, out, a, b) ||
        tryUnsigned<uint64_t>(kind_, out, a, b)) {
      return;
    }
    const bool boolean = out.scalar_type() == at::kBool;
    const bool half = out.scalar_type() == at::kHalf || out.scalar_type() == at::kBFloat16;
    if (scale != 1.0 && half) {
      // One rounding to 16 bits per step, as on the GPU: (a + b) * scale in fp32.
      out.copy_(a.to(at::kFloat).add_(b.to(at::kFloat)).mul_(scale));
      return;
    }
    switch (kind_) {
      case c10d::ReduceOp::SUM:
        if (boolean)
          at::logical_or_out(out, a, b);
        else
          at::add_out(out, a, b);
        break;
      case c10d::ReduceOp::PRODUCT:
        if (boolean)
          at::logical_and_out(out, a, b);
        else
          at::mul_out(out, a, b);
        break;
      case c10d::ReduceOp::MIN:
        if (boolean)
          at::logical_and_out(out, a, b);
        else
          at::minimum_out(out, a, b);
        break;
      case c10d::ReduceOp::MAX:
        if (boolean)
          at::logical_or_out(out, a, b);
        else
          at::maximum_out(out, a, b);
        break;
      case c10d::ReduceOp::BAND: at::bitwise_and_out(out, a, b); break;
      case c10d::ReduceOp::BOR: at::bitwise_or_out(out, a, b); break;
      case c10d::ReduceOp::BXOR:
        if (boolean)
          at::logical_xor_out(out, a, b);
        else
          at::bitwise_xor_out(out, a, b);
        break;
      default: TORCH_CHECK(false, "mpigpu: host reducer got reduce op ", static_cast<int>(kind_));
    }
    if (scale != 1.0) out.mul_(scale);
  }

  const c10d::ReduceOp::RedOpType kind_;
};

}  // namespace

std::unique_ptr<Reducer> makeHostReducer(c10d::ReduceOp::RedOpType kind) {
  return std::make_unique<HostReducer>(kind);
}

}  // namespace mpigpu::algo
