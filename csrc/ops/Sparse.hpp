// all_reduce of sparse COO tensors (DDP's sparse embedding gradients). MPI has no sparse
// reduction, so, as gloo does: every rank gathers every rank's indices and values and sums them
// itself, in rank order, on the host. The result is then the same on every rank, whatever device
// its tensors are on, and each rank moves the group's nonzeros, which sparse gradients are few
// enough for.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

#include "mpi/Collectives.hpp"

namespace mpigpu::sparse {

// Caller thread: sparse COO tensors of one device and dtype, reduced by SUM or AVG.
void checkAllreduce(const char* op, int rank, const std::vector<at::Tensor>& tensors,
                    const c10d::ReduceOp& reduceOp);

// Engine thread, collective over `comm`: `t` replaced by the sum (or the average) of every rank's
// `t`, coalesced. On a device, copies run on the current stream (the op's).
void allreduceInPlace(const mpi::Comm& comm, const char* op, at::Tensor& t, bool average);

}  // namespace mpigpu::sparse
