// The kernels behind the CUDA reducer (cuda/CudaReducer.hpp): dst = (a op b) * scale, queued on the
// current stream of dst's device. The caller (cuda/CudaReducer.cpp) has checked the tensors and
// set the device; this header stays light because nvcc compiles what includes it.
#pragma once

#include <ATen/core/Tensor.h>

namespace mpigpu::cuda {

// The arithmetic of a step (AVG and PREMUL_SUM are kSum with a scale).
enum class Arith { kSum, kProd, kMin, kMax, kAnd, kOr, kXor };

// Contiguous tensors of one real dtype and size on one CUDA device (complex: their real views).
// `also`: undefined, or a second output written in the same pass (it may be a).
void launchCombine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b, Arith arith,
                   double scale, const at::Tensor& also);

}  // namespace mpigpu::cuda
