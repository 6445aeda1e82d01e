// The host data path: MPI works on contiguous host memory. CPU tensors are used in place when
// contiguous; non-contiguous ones and tensors of other devices (XPU, ... and CUDA until the CUDA
// paths take them) are copied to a host buffer on the calling thread, in stream order, and the
// result is copied back on the worker before the Work completes.
#pragma once

#include <ATen/ATen.h>

namespace mpigpu::paths {

struct HostBuffer {
  at::Tensor user;  // what the caller passed
  at::Tensor mpi;   // flat, contiguous, on the host: what MPI reads and writes
  bool copyBack = false;

  // Writes the MPI result into the caller's tensor when they are not the same memory.
  void finish() const {
    if (copyBack) user.copy_(mpi.view(user.sizes()));
  }
};

HostBuffer forInput(const at::Tensor& t);   // MPI reads it
HostBuffer forInOut(const at::Tensor& t);   // MPI reads and writes it
HostBuffer forOutput(const at::Tensor& t);  // MPI writes it

} // namespace mpigpu::paths
