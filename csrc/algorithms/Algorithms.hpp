// Our own reduction algorithms: compositions of point-to-point messages (Link) and a local
// reduction step (Reducer), so a CUDA tensor is reduced by the GPU even where the MPI library
// would reduce device buffers on the host. The same code runs on host buffers, which is how CPU
// CI tests every algorithm.
//
//   ring       reduce-scatter + all-gather around the ring: 2(p-1) steps of n/p elements each,
//              bandwidth-optimal for any rank count
//   rhd        recursive halving (reduce-scatter) + recursive doubling (all-gather), 2 log2(p)
//              steps; a rank count that is not a power of two first folds the extra ranks into
//              their neighbours and unfolds at the end
//   allgather  every rank gathers all inputs (one MPI_Allgather) and reduces them locally:
//              one message round, the latency-optimal choice for small messages
//
// Every step's messages are cut into pieces of at most pieceElems elements, all posted at once,
// so while piece j is being reduced piece j+1 is still arriving. Every rank ends with bitwise
// the same result: each block is reduced by exactly one rank, in an order fixed by the rank
// count alone (ring: around the ring starting after the block's owner; rhd: pairwise along the
// hypercube; allgather: rank 0, 1, 2, ... on every rank), and then copied to the others.
//
// reduce_scatter and reduce always use the ring (its blocks are the ranks' output blocks).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>

#include "Config.hpp"
#include "algorithms/Link.hpp"
#include "algorithms/Reducer.hpp"
#include "mpi/Types.hpp"

namespace mpigpu::algo {

// (Algo, the setting's values, is declared with the settings: Config.hpp)
const char* algoName(Algo a);

enum class OpKind { Allreduce, ReduceScatter, Reduce };

// An op's algorithm. Everything it depends on is the same on every rank of a group (sizes, dtype,
// rank count, settings, and whether any member has a GPU, agreed when the group was made), so
// every rank picks the same algorithm even when their tensors live on different devices. On the
// per-op path: no strings.
Algo choose(const Config& config, OpKind kind, int64_t bytes, at::ScalarType dtype, int worldSize,
            bool groupHasGpu);
// One line for info() and the group's description: the rule `choose` follows, and why.
std::string describeChoice(const Config& config, bool groupHasGpu);

struct Context {
  Link& link;
  Reducer& reducer;
  const mpi::Reduction& red;
  int64_t pieceElems;  // largest message, in elements
};

// How many ops each algorithm has run in this process (tests prove a forced algorithm ran).
uint64_t runCount(Algo a);

// In place on `buf` (every rank's result in every rank's buf).
void allreduce(Context& c, Algo algo, const at::Tensor& buf);
// `in` holds size x out.numel() elements, rank-major; rank r gets block r reduced, in `out`.
// `in` is not modified.
void reduceScatter(Context& c, const at::Tensor& in, const at::Tensor& out);
// The root's `buf` gets the reduction; other ranks' `buf` is read only.
void reduce(Context& c, const at::Tensor& buf, int root);

}  // namespace mpigpu::algo
