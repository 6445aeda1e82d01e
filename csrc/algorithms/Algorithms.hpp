// Our own reduction algorithms: compositions of point-to-point messages (Link) and a local
// reduction step (Reducer), so a CUDA tensor is reduced by the GPU even where the MPI library
// would reduce device buffers on the host; and node-aware ones that reach the node's peers through
// shared memory (algorithms/NodeAlgorithms.cpp). The same code runs on host buffers, which is how
// CPU CI tests every algorithm.
//
// Every algorithm is one row of one table (Algorithms.cpp: `kTable`): its name (the value of
// TORCH_MPIGPU_ALGO that forces it), the ops it serves, one function per op, and when `auto`
// picks it. Adding one is adding a row.
//
//   node       ranks on one node: every rank's input in shared memory, then one-shot (each rank
//              reduces every slot, small ops) or two-shot (each reduces its 1/p slice, then all
//              copy the slices). Across nodes, hierarchical: reduce inside the node, the slice
//              over MPI between same-local-index ranks, gather inside the node (where nodes hold
//              different counts: one slice per local index every node has, a lane). all_gather,
//              reduce_scatter and broadcast too: over MPI between same-local-index ranks, then
//              through the slots
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
// hypercube; allgather and node: rank 0, 1, 2, ... on every rank), and then copied to the others.
//
// A reduction a forced algorithm does not serve, or cannot run in this group (node without a
// segment), runs the ring. all_gather and broadcast run the node algorithm where it is chosen
// and can run, MPI's own collectives otherwise.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "core/Config.hpp"
#include "algorithms/Context.hpp"

namespace mpigpu::algo {

// One row of the table. An op function returns false when it cannot run in this group (the ring
// runs the op instead); nullptr: the op is not served.
struct Algorithm {
  const char* name;
  const char* summary;
  bool (*allreduce)(Context& c, const at::Tensor& buf);
  // `in` holds size x out.numel() elements, rank-major; rank r gets block r reduced, in `out`.
  bool (*reduceScatter)(Context& c, const at::Tensor& in, const at::Tensor& out);
  // The root's `buf` gets the reduction; other ranks' `buf` is read only.
  bool (*reduce)(Context& c, const at::Tensor& buf, int root);
  // `out` (contiguous) gets size blocks of in.numel() elements, in rank order.
  bool (*allgather)(Context& c, const at::Tensor& in, const at::Tensor& out);
  bool (*broadcast)(Context& c, const at::Tensor& buf, int root);
  // auto: whether this row takes the op (rows are asked in table order; MPI's own collectives
  // take what none does), and that rule in words ("" : only when forced).
  bool (*autoPicks)(const Config& config, const Facts& facts);
  std::string (*autoRule)(const Config& config, bool groupHasGpu);
};

// Every row, in the order auto asks them.
const std::vector<const Algorithm*>& algorithms();
const Algorithm& ring();
const Algorithm& node();

// TORCH_MPIGPU_ALGO resolved once per group: auto, mpi (MPI's own for every op), or a row.
struct Policy {
  bool forced = false;
  const Algorithm* algorithm = nullptr;  // forced: null means mpi
};
// A word that is neither auto, mpi nor a row's name is a ValueError listing the words.
Policy policyFor(const std::string& word);

// An op's algorithm; null: MPI's own collectives. On the per-op path: no strings. For data
// movement only a row that serves the op is chosen, forced or not.
const Algorithm* choose(const Policy& policy, const Config& config, const Facts& facts);
// As choose, for an op whose buffers were made for our algorithms: never null (the ring).
const Algorithm& chooseOurs(const Policy& policy, const Config& config, const Facts& facts);
// One line for info() and the group's description: the rule `choose` follows, and why.
std::string describeChoice(const Policy& policy, const Config& config, bool groupHasGpu);

// How many ops each algorithm has run in this process (tests prove a forced algorithm ran).
uint64_t runCount(const Algorithm& a);

// Run `a` for the op (the ring where `a` does not serve it or cannot run here).
void allreduce(Context& c, const Algorithm& a, const at::Tensor& buf);
void reduceScatter(Context& c, const Algorithm& a, const at::Tensor& in, const at::Tensor& out);
void reduce(Context& c, const Algorithm& a, const at::Tensor& buf, int root);
// Data movement: false when `a` cannot run it here (the caller runs MPI's own).
bool allgather(Context& c, const Algorithm& a, const at::Tensor& in, const at::Tensor& out);
bool broadcast(Context& c, const Algorithm& a, const at::Tensor& buf, int root);

}  // namespace mpigpu::algo
