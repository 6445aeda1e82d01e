// The local arithmetic step of our reduction algorithms: one implementation per device kind
// (host: ATen's vectorized CPU kernels; CUDA: our kernels in cuda/ReduceKernels.cu), both with
// the semantics the README documents (fp16/bf16 computed in fp32 and rounded once per step,
// integers wrap, bool is logical, NaN propagates through MIN/MAX).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>

namespace mpigpu::algo {

class Reducer {
 public:
  virtual ~Reducer() = default;
  // dst = (a op b) * scale, elementwise; scale 1 means none (AVG passes 1/size on the step that
  // finishes a block). dst may be a. All contiguous, same dtype and size, on the reducer's device;
  // on a device the work is queued on the current stream.
  virtual void combine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
                       double scale) = 0;
  // combine(), the result written to `also` too (same dtype and size; it may be a): one pass
  // where the device's kernel writes both outputs, else a copy after.
  virtual void combineToBoth(const at::Tensor& dst, const at::Tensor& also, const at::Tensor& a,
                             const at::Tensor& b, double scale) {
    combine(dst, a, b, scale);
    also.copy_(dst);
  }
};

// The arithmetic of a c10d reduce op, for every reducer: AVG and PREMUL_SUM are SUM (their
// scaling is done around the algorithm).
inline c10d::ReduceOp::RedOpType arithmeticOf(c10d::ReduceOp::RedOpType kind) {
  const bool sum = kind == c10d::ReduceOp::AVG || kind == c10d::ReduceOp::PREMUL_SUM;
  return sum ? c10d::ReduceOp::SUM : kind;
}

std::unique_ptr<Reducer> makeHostReducer(c10d::ReduceOp::RedOpType kind);

}  // namespace mpigpu::algo
