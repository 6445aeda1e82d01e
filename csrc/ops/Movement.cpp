// broadcast, all_gather, gather, scatter, all_to_all, barrier: checked and planned
// (ops/OpPlan.hpp).
#include <algorithm>
#include <numeric>

#include "ops/ArgChecks.hpp"
#include "core/Errors.hpp"
#include "ops/Fusion.hpp"
#include "mpi/Types.hpp"
#include "ops/OpPlan.hpp"

namespace mpigpu::ops {

using paths::Access;
using paths::OpBuffers;

namespace {

// What a rank sends itself it receives from itself: the one pair of an all_to_all a rank can check
// alone (the own block is copied locally, not through MPI, which would have caught it).
void checkOwnBlock(const Group& g, const char* op, const std::vector<int64_t>& sendCounts,
                   const std::vector<int64_t>& recvCounts) {
  MPIGPU_CHECK_VALUE(sendCounts[g.rank] == recvCounts[g.rank], op, g.rank, "sends itself ",
                     sendCounts[g.rank], " elements but receives ", recvCounts[g.rank],
                     " from itself; input and output split sizes must agree at index ", g.rank);
}

// all_to_all_single's counts per peer, in elements: split sizes along dim 0, or even blocks.
std::vector<int64_t> splitCounts(const Group& g, const char* op, const at::Tensor& t,
                                 const std::vector<int64_t>& splits, const char* what) {
  std::vector<int64_t> c(g.size);
  if (splits.empty()) {
    MPIGPU_CHECK_VALUE(t.numel() % g.size == 0, op, g.rank, what, " has ", t.numel(),
                       " elements, which do not divide evenly across ", g.size,
                       " ranks; give split sizes");
    std::fill(c.begin(), c.end(), t.numel() / g.size);
    return c;
  }
  MPIGPU_CHECK_VALUE(static_cast<int>(splits.size()) == g.size, op, g.rank, what,
                     " split sizes have ", splits.size(), " entries, the group has ", g.size,
                     " ranks");
  MPIGPU_CHECK_VALUE(t.dim() > 0, op, g.rank, what, " is a scalar and cannot be split");
  const int64_t sum = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  MPIGPU_CHECK_VALUE(sum == t.size(0), op, g.rank, what, " split sizes sum to ", sum,
                     " but dim 0 is ", t.size(0));
  const int64_t row = t.size(0) == 0 ? 0 : t.numel() / t.size(0);
  for (int p = 0; p < g.size; ++p) {
    MPIGPU_CHECK_VALUE(splits[p] >= 0, op, g.rank, what, " split sizes must be >= 0");
    c[p] = splits[p] * row;
  }
  return c;
}

// The root's list of `size` tensors, each of `ref`'s kind and element count; other ranks give none.
std::vector<at::Tensor> rootList(const Group& g, const char* op, int root,
                                 const std::vector<std::vector<at::Tensor>>& lists,
                                 const at::Tensor& ref, const char* kind, const char* refName) {
  if (g.rank != root) {
    MPIGPU_CHECK_VALUE(lists.empty() || (lists.size() == 1 && lists[0].empty()), op, g.rank,
                       "only the root (rank ", root, ") takes ", kind, " tensors");
    return {};
  }
  MPIGPU_CHECK_VALUE(lists.size() == 1 && static_cast<int>(lists[0].size()) == g.size, op, g.rank,
                     "the root needs one ", kind, " list of ", g.size, " tensors");
  const std::string an = std::string("an ") + kind;
  for (const auto& t : lists[0]) {
    checkSameKind(op, g.rank, ref, t, an.c_str());
    MPIGPU_CHECK_VALUE(t.numel() == ref.numel(), op, g.rank, "every ", kind, " must have the ",
                       refName, "'s ", ref.numel(), " elements, one has ", t.numel());
  }
  return lists[0];
}

}  // namespace

Plan broadcast(const Group& g, std::vector<at::Tensor>& tensors,
               const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  checkSingle(op, g.rank, tensors);
  checkRank(op, g.rank, g.size, opts.rootRank, "root");
  MPIGPU_CHECK_VALUE(opts.rootTensor == 0, op, g.rank, "rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  mpi::transportType(tensors[0].scalar_type(), op, g.rank);
  const algo::Algorithm* mover = g.choose(algo::OpKind::Broadcast, tensors);
  auto bufs = g.buffers(tensors[0]);
  const size_t slot = bufs->add(tensors[0], g.rank == root ? Access::Read : Access::Write,
                                /*elementwise=*/true);
  return {c10d::OpType::BROADCAST,
          op,
          tensors,
          tensors,
          opts.timeout,
          opts.asyncOp,
          bufs,
          [gp = &g, op, slot, root, mover](OpBuffers& b) {
            b.run(slot, [&](at::Tensor& t) { gp->broadcastFrom(b, op, mover, t, root); });
          },
          root};
}

Plan allgather(const Group& g, std::vector<std::vector<at::Tensor>>& outputs,
               std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const char* op = "allgather";
  checkSingle(op, g.rank, inputs);
  MPIGPU_CHECK_VALUE(outputs.size() == 1, op, g.rank, "expects one output list, got ",
                     outputs.size());
  MPIGPU_CHECK_VALUE(static_cast<int>(outputs[0].size()) == g.size, op, g.rank, "output list has ",
                     outputs[0].size(), " tensors, the group has ", g.size, " ranks");
  // Output r holds rank r's input. Torch allows the ranks' inputs to differ in size: then the
  // blocks travel by MPI_Allgatherv (our algorithms move equal blocks only).
  const std::vector<int64_t> counts = blockCounts(g, op, outputs[0], inputs[0], "output", "input");
  const bool even =
      std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == inputs[0].numel(); });
  mpi::transportType(inputs[0].scalar_type(), op, g.rank);
  const algo::Algorithm* mover = even ? g.choose(algo::OpKind::Allgather, outputs[0]) : nullptr;
  auto bufs = g.buffers(inputs[0]);
  const size_t in = bufs->add(inputs[0], Access::Read);
  const size_t out = bufs->add(outputs[0], Access::Write);
  return {c10d::OpType::ALLGATHER,
          op,
          outputs[0],
          inputs,
          opts.timeout,
          opts.asyncOp,
          bufs,
          [gp = &g, op, in, out, mover, even, counts](OpBuffers& b) {
            if (even)
              gp->gatherAll(b, op, mover, b.mpi(in), b.mpi(out));
            else
              mpi::allgatherv(gp->comm, op, b.mpi(in), b.mpi(out), counts);
          }};
}

Plan allgatherTensors(const Group& g, std::vector<at::Tensor>& outputs,
                      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  checkNarrowWide(g, op, inputs, "input", outputs, "output");
  for (const auto& t : inputs) mpi::transportType(t.scalar_type(), op, g.rank);
  const algo::Algorithm* mover = g.choose(algo::OpKind::Allgather, outputs);
  auto bufs = g.buffers(inputs[0]);
  const auto buckets = packBuckets(g, *bufs, inputs, Access::Read, outputs, Access::Write);
  return {c10d::OpType::_ALLGATHER_BASE,
          op,
          outputs,
          inputs,
          opts.timeout,
          opts.asyncOp,
          bufs,
          [gp = &g, op, buckets, mover](OpBuffers& b) {
            for (const auto& k : buckets)
              gp->gatherAll(b, op, mover, b.mpi(k.narrow), b.mpi(k.wide));
          }};
}

Plan allgatherCoalesced(const Group& g, std::vector<std::vector<at::Tensor>>& outputLists,
                        std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  MPIGPU_CHECK_VALUE(outputLists.size() == static_cast<size_t>(g.size), op, g.rank,
                     "expects one output list per rank (", g.size, "), got ", outputLists.size());
  MPIGPU_CHECK_VALUE(!inputs.empty(), op, g.rank, "got an empty input list");
  for (const auto& t : inputs) checkSameKind(op, g.rank, inputs[0], t, "an input");
  std::vector<at::Tensor> allOuts;
  for (const auto& list : outputLists) {
    MPIGPU_CHECK_VALUE(list.size() == inputs.size(), op, g.rank, "every output list must have ",
                       inputs.size(), " tensors (one per input), one has ", list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      checkSameKind(op, g.rank, inputs[i], list[i], "an output");
      MPIGPU_CHECK_VALUE(list[i].numel() == inputs[i].numel(), op, g.rank,
                         "output sizes must match the inputs");
      allOuts.push_back(list[i]);
    }
  }
  mpi::transportType(inputs[0].scalar_type(), op, g.rank);
  const algo::Algorithm* mover = g.choose(algo::OpKind::Allgather, allOuts);
  auto bufs = g.buffers(inputs[0]);
  const size_t in = bufs->add(inputs, Access::Read);
  const size_t out = bufs->add(allOuts, Access::Write);  // rank-major, input order within a rank
  return {c10d::OpType::ALLGATHER_COALESCED,
          op,
          allOuts,
          inputs,
          opts.timeout,
          opts.asyncOp,
          bufs,
          [gp = &g, op, in, out, mover](OpBuffers& b) {
            gp->gatherAll(b, op, mover, b.mpi(in), b.mpi(out));
          }};
}

Plan gather(const Group& g, std::vector<std::vector<at::Tensor>>& outputs,
            std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const char* op = "gather";
  checkSingle(op, g.rank, inputs);
  checkRank(op, g.rank, g.size, opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = g.rank == root;
  std::vector<at::Tensor> outs = rootList(g, op, root, outputs, inputs[0], "output", "input");
  mpi::transportType(inputs[0].scalar_type(), op, g.rank);
  auto bufs = g.buffers(inputs[0]);
  const size_t in = bufs->add(inputs[0], Access::Read);
  const size_t out = isRoot ? bufs->add(outs, Access::Write) : 0;
  return {c10d::OpType::GATHER,
          op,
          outs,
          inputs,
          opts.timeout,
          opts.asyncOp,
          bufs,
          [gp = &g, op, in, out, root, isRoot](OpBuffers& b) {
            mpi::gather(gp->comm, op, b.mpi(in), isRoot ? &b.mpi(out) : nullptr, root);
          },
          root};
}

Plan scatter(const Group& g, std::vector<at::Tensor>& outputs,
             std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  checkSingle(op, g.rank, outputs);
  checkRank(op, g.rank, g.size, opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = g.rank == root;
  std::vector<at::Tensor> ins = rootList(g, op, root, inputs, outputs[0], "input", "output");
  mpi::transportType(outputs[0].scalar_type(), op, g.rank);
  auto bufs = g.buffers(outputs[0]);
  const size_t in = isRoot ? bufs->add(ins, Access::Read) : 0;
  const size_t out = bufs->add(outputs[0], Access::Write);
  return {c10d::OpType::SCATTER,
          op,
          outputs,
          ins,
          opts.timeout,
          opts.asyncOp,
          bufs,
          [gp = &g, op, in, out, root, isRoot](OpBuffers& b) {
            mpi::scatter(gp->comm, op, isRoot ? &b.mpi(in) : nullptr, b.mpi(out), root);
          },
          root};
}

Plan alltoallSingle(const Group& g, at::Tensor& output, at::Tensor& input,
                    const std::vector<int64_t>& outputSplitSizes,
                    const std::vector<int64_t>& inputSplitSizes,
                    const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  checkTensor(op, g.rank, input);
  checkSameKind(op, g.rank, input, output, "the output");
  mpi::transportType(input.scalar_type(), op, g.rank);
  auto sendCounts = splitCounts(g, op, input, inputSplitSizes, "input");
  auto recvCounts = splitCounts(g, op, output, outputSplitSizes, "output");
  checkOwnBlock(g, op, sendCounts, recvCounts);
  // Without split sizes every rank sends the same counts (torch requires equal sizes then).
  const bool uniform =
      inputSplitSizes.empty() && outputSplitSizes.empty() && input.numel() == output.numel();
  auto bufs = g.buffers(input);
  const size_t in = bufs->add(input, Access::Read);
  const size_t out = bufs->add(output, Access::Write);
  return {c10d::OpType::ALLTOALL_BASE,
          op,
          {output},
          {input},
          opts.timeout,
          opts.asyncOp,
          bufs,
          [gp = &g, op, in, out, sendCounts, recvCounts, uniform](OpBuffers& b) {
            mpi::alltoallv(gp->comm, op, b.mpi(in), sendCounts, b.mpi(out), recvCounts, uniform,
                           !gp->hasGpu);
          }};
}

Plan alltoall(const Group& g, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
              const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  MPIGPU_CHECK_VALUE(
      static_cast<int>(inputs.size()) == g.size && static_cast<int>(outputs.size()) == g.size, op,
      g.rank, "needs one input and one output tensor per rank (", g.size, "), got ", inputs.size(),
      " and ", outputs.size());
  std::vector<int64_t> sendCounts, recvCounts;
  for (int p = 0; p < g.size; ++p) {
    checkSameKind(op, g.rank, inputs[0], inputs[p], "an input");
    checkSameKind(op, g.rank, inputs[0], outputs[p], "an output");
    sendCounts.push_back(inputs[p].numel());
    recvCounts.push_back(outputs[p].numel());
  }
  checkOwnBlock(g, op, sendCounts, recvCounts);
  mpi::transportType(inputs[0].scalar_type(), op, g.rank);
  auto bufs = g.buffers(inputs[0]);
  const size_t in = bufs->add(inputs, Access::Read);
  const size_t out = bufs->add(outputs, Access::Write);
  return {c10d::OpType::ALLTOALL,
          op,
          outputs,
          inputs,
          opts.timeout,
          opts.asyncOp,
          bufs,
          [gp = &g, op, in, out, sendCounts, recvCounts](OpBuffers& b) {
            mpi::alltoallv(gp->comm, op, b.mpi(in), sendCounts, b.mpi(out), recvCounts);
          }};
}

Plan barrier(const Group& g, const c10d::BarrierOptions& opts) {
  const char* op = "barrier";
  return {c10d::OpType::BARRIER,
          op,
          {},
          {},
          opts.timeout,
          opts.asyncOp,
          g.paths->create(at::kCPU),
          [gp = &g, op](OpBuffers&) { mpi::barrier(gp->comm, op); }};
}

}  // namespace mpigpu::ops
