// Whether two tensors' memory overlaps. The MPI standard forbids a send buffer that overlaps the
// receive buffer (MPICH rejects it: "Buffers must not be aliased"; Open MPI happens to tolerate
// some), and our own algorithms send from an input while they write the output: in-place torch
// calls (FSDP's all_gather_into_tensor / reduce_scatter_tensor on views of one buffer,
// all_to_all_single(t, t)) produce exactly that.
#pragma once

#include <ATen/ATen.h>

namespace mpigpu {

inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* a0 = static_cast<const char*>(a.const_data_ptr());
  const char* b0 = static_cast<const char*>(b.const_data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace mpigpu
