// The CUDA reducer (its kernels: cuda/ReduceKernels.cu). dst = (a op b) * scale for every
// reduce op and dtype, fp16/bf16 computed in fp32 and rounded once, integers wrapping, bool
// logical, 16-byte vectorized loads where the pointers allow; queued on the current stream (the
// group's comm stream when an algorithm runs).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>

#include "algorithms/Reducer.hpp"

namespace mpigpu::cuda {

// `also` (optional): a second output, written in the same pass (it may be a).
void combine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
             c10d::ReduceOp::RedOpType kind, double scale, const at::Tensor& also = {});

std::unique_ptr<algo::Reducer> makeCudaReducer(c10d::ReduceOp::RedOpType kind);

}  // namespace mpigpu::cuda
