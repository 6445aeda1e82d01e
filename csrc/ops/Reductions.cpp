// all_reduce, reduce, reduce_scatter: checked and planned (ops/OpPlan.hpp).
#include <algorithm>

#include "ops/ArgChecks.hpp"
#include "core/Errors.hpp"
#include "ops/Fusion.hpp"
#include "ops/Sparse.hpp"
#include "mpi/Types.hpp"
#include "ops/OpPlan.hpp"

namespace mpigpu::ops {

using paths::Access;
using paths::OpBuffers;

namespace {

// A reduction's plan carries its reduce op, which every rank must share (ops/Desync.hpp).
Plan reducing(Plan plan, const c10d::ReduceOp& reduceOp) {
  plan.redop = static_cast<int>(reduceOp.op_);
  return plan;
}

// An all_reduce's algorithms, chosen in one place: whose collectives the op uses (its buffers
// are made for that), and where ours, which of ours each fused bucket takes by its own size.
struct AllreduceChoice {
  bool ours = false;
  std::vector<const algo::Algorithm*> perBucket;  // null: MPI's own
};

AllreduceChoice chooseAllreduce(const Group& g, const std::vector<at::Tensor>& tensors,
                                const std::vector<std::vector<size_t>>& buckets) {
  AllreduceChoice choice;
  const algo::Algorithm* whole = g.choose(algo::OpKind::Allreduce, tensors);
  choice.ours = whole != nullptr;
  if (buckets.size() == 1 && buckets[0].size() == tensors.size()) {  // one bucket: the same facts
    choice.perBucket.push_back(whole);
    return choice;
  }
  for (const auto& idx : buckets) {
    choice.perBucket.push_back(
        choice.ours ? &algo::chooseOurs(g.policy, g.config,
                                        g.facts(algo::OpKind::Allreduce, pick(tensors, idx)))
                    : nullptr);
  }
  return choice;
}
}  // namespace

std::vector<int64_t> blockCounts(const Group& g, const char* op,
                                 const std::vector<at::Tensor>& blocks, const at::Tensor& mine,
                                 const char* block, const char* own) {
  std::vector<int64_t> counts;
  const std::string what = std::string("an ") + block;
  for (const auto& t : blocks) {
    checkSameKind(op, g.rank, mine, t, what.c_str());
    counts.push_back(t.numel());
  }
  MPIGPU_CHECK_VALUE(counts[g.rank] == mine.numel(), op, g.rank, block, " ", g.rank,
                     " (this rank's own block) has ", counts[g.rank], " elements but the ", own,
                     " has ", mine.numel(), "; ", block, " r must have the size of rank r's ", own);
  return counts;
}

// Runs one all_reduce slot: MPI's own where `algorithm` is null, else ours.
void runAllreduceSlot(const Group& g, OpBuffers& b, size_t slot, const char* op,
                      const mpi::Reduction& red, const algo::Algorithm* algorithm) {
  b.run(slot, [&](at::Tensor& t) {
    if (algorithm == nullptr) {
      mpi::allreduceInPlace(g.comm, op, t, red);
      return;
    }
    g.withAlgorithm(b, op, t, red, [&](algo::Context& c) { algo::allreduce(c, *algorithm, t); });
  });
}

// One tensor (every dist.all_reduce): no fusion to plan, so none of the buckets' vectors; the
// common small op pays only for what it uses (#68).
Plan allreduceOne(const Group& g, std::vector<at::Tensor>& tensors,
                  const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  checkTensor(op, g.rank, tensors[0]);
  const algo::Algorithm* ours = g.choose(algo::OpKind::Allreduce, tensors);
  auto red = mpi::resolveReduction(opts.reduceOp, tensors[0].scalar_type(), op, g.rank);
  auto bufs = g.reduceBuffers(tensors[0], ours != nullptr);
  const size_t slot = bufs->add(tensors[0], Access::ReadWrite, /*elementwise=*/true);
  if (g.onDeviceSlots(ours)) bufs->deferStartWait();
  return reducing(
      Plan{c10d::OpType::ALLREDUCE, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
           [gp = &g, op, slot, red = std::move(red), ours](OpBuffers& b) {
             runAllreduceSlot(*gp, b, slot, op, red, ours);
           }},
      opts.reduceOp);
}

Plan allreduce(const Group& g, std::vector<at::Tensor>& tensors,
               const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  if (tensors.size() == 1) return allreduceOne(g, tensors, opts);
  for (const auto& t : tensors) checkSameDevice(op, g.rank, tensors[0], t, "a tensor");
  struct Bucket {
    size_t slot;
    mpi::Reduction red;
    const algo::Algorithm* algo;  // null: MPI's own
  };
  const auto fused = g.buckets(tensors);
  const AllreduceChoice choice = chooseAllreduce(g, tensors, fused);
  auto bufs = g.reduceBuffers(tensors[0], choice.ours);
  std::vector<Bucket> buckets;
  for (size_t k = 0; k < fused.size(); ++k) {
    auto red = mpi::resolveReduction(opts.reduceOp, tensors[fused[k][0]].scalar_type(), op, g.rank);
    buckets.push_back({bufs->add(pick(tensors, fused[k]), Access::ReadWrite, /*elementwise=*/true),
                       std::move(red), choice.perBucket[k]});
  }
  if (std::all_of(buckets.begin(), buckets.end(),
                  [&](const Bucket& k) { return g.onDeviceSlots(k.algo); }))
    bufs->deferStartWait();
  return reducing(
      Plan{c10d::OpType::ALLREDUCE, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
           [gp = &g, op, buckets](OpBuffers& b) {
             for (const auto& k : buckets) runAllreduceSlot(*gp, b, k.slot, op, k.red, k.algo);
           }},
      opts.reduceOp);
}

Plan allreduceSparse(const Group& g, std::vector<at::Tensor>& tensors,
                     const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  sparse::checkAllreduce(op, g.rank, tensors, opts.reduceOp);
  const bool average = opts.reduceOp == c10d::ReduceOp::AVG;
  // No slots: the device's buffers only order the op after the caller's stream, run it on the
  // op's stream and order the caller's stream after it, as for dense tensors.
  return {c10d::OpType::ALLREDUCE,
          op,
          tensors,
          tensors,
          opts.timeout,
          opts.asyncOp,
          g.paths->create(tensors[0].device()),
          [gp = &g, op, tensors, average](OpBuffers&) mutable {
            for (auto& t : tensors) sparse::allreduceInPlace(gp->comm, op, t, average);
          }};
}

Plan reduce(const Group& g, std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  checkSingle(op, g.rank, tensors);
  checkRank(op, g.rank, g.size, opts.rootRank, "root");
  MPIGPU_CHECK_VALUE(opts.rootTensor == 0, op, g.rank, "rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  auto red = mpi::resolveReduction(opts.reduceOp, tensors[0].scalar_type(), op, g.rank);
  const algo::Algorithm* ours = g.choose(algo::OpKind::Reduce, tensors);
  auto bufs = g.reduceBuffers(tensors[0], ours != nullptr);
  // Only the root's tensor changes.
  const size_t slot = bufs->add(tensors[0], g.rank == root ? Access::ReadWrite : Access::Read,
                                /*elementwise=*/true);
  return reducing(Plan{c10d::OpType::REDUCE, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
                       [gp = &g, op, slot, red, root, ours](OpBuffers& b) {
                         b.run(slot, [&](at::Tensor& t) {
                           if (!ours) {
                             mpi::reduce(gp->comm, op, t, t, red, root);
                             return;
                           }
                           gp->withAlgorithm(b, op, t, red, [&](algo::Context& c) {
                             algo::reduce(c, *ours, t, root);
                           });
                         });
                       },
                       root},
                  opts.reduceOp);
}

Plan reduceScatter(const Group& g, std::vector<at::Tensor>& outputs,
                   std::vector<std::vector<at::Tensor>>& inputs,
                   const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  checkSingle(op, g.rank, outputs);
  MPIGPU_CHECK_VALUE(inputs.size() == 1, op, g.rank, "expects one input list, got ", inputs.size());
  MPIGPU_CHECK_VALUE(static_cast<int>(inputs[0].size()) == g.size, op, g.rank, "input list has ",
                     inputs[0].size(), " tensors, the group has ", g.size, " ranks");
  // Input r is reduced into rank r's output. Blocks of different sizes (as NCCL allows) go to
  // MPI_Reduce_scatter with its counts (our algorithms reduce equal blocks only).
  const std::vector<int64_t> counts = blockCounts(g, op, inputs[0], outputs[0], "input", "output");
  const bool even =
      std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == outputs[0].numel(); });
  auto red = mpi::resolveReduction(opts.reduceOp, outputs[0].scalar_type(), op, g.rank);
  const algo::Algorithm* ours = even ? g.choose(algo::OpKind::ReduceScatter, inputs[0]) : nullptr;
  auto bufs = g.reduceBuffers(outputs[0], ours != nullptr);
  if (g.onDeviceSlots(ours)) bufs->deferStartWait();
  const size_t in = bufs->add(inputs[0], Access::Read);
  const size_t out = bufs->add(outputs[0], Access::Write);
  return reducing(
      Plan{c10d::OpType::REDUCE_SCATTER, op, outputs, inputs[0], opts.timeout, opts.asyncOp, bufs,
           [gp = &g, op, in, out, red, ours, even, counts](OpBuffers& b) {
             if (!even) {
               mpi::reduceScatterV(gp->comm, op, b.mpi(in), b.mpi(out), counts, red);
               return;
             }
             if (!ours) {
               mpi::reduceScatter(gp->comm, op, b.mpi(in), b.mpi(out), red);
               return;
             }
             gp->withAlgorithm(b, op, b.mpi(in), red, [&](algo::Context& c) {
               algo::reduceScatter(c, *ours, b.mpi(in), b.mpi(out));
             });
           }},
      opts.reduceOp);
}

Plan reduceScatterTensors(const Group& g, std::vector<at::Tensor>& outputs,
                          std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  checkNarrowWide(g, op, outputs, "output", inputs, "input");
  struct Bucket {
    size_t in, out;
    mpi::Reduction red;
  };
  const algo::Algorithm* ours = g.choose(algo::OpKind::ReduceScatter, inputs);
  auto bufs = g.reduceBuffers(outputs[0], ours != nullptr);
  if (g.onDeviceSlots(ours)) bufs->deferStartWait();
  std::vector<Bucket> buckets;
  for (const auto& k : packBuckets(g, *bufs, outputs, Access::Write, inputs, Access::Read)) {
    buckets.push_back(
        {k.wide, k.narrow,
         mpi::resolveReduction(opts.reduceOp, outputs[k.first].scalar_type(), op, g.rank)});
  }
  return reducing(Plan{c10d::OpType::_REDUCE_SCATTER_BASE, op, outputs, inputs, opts.timeout,
                       opts.asyncOp, bufs,
                       [gp = &g, op, buckets, ours](OpBuffers& b) {
                         for (const auto& k : buckets) {
                           if (!ours) {
                             mpi::reduceScatter(gp->comm, op, b.mpi(k.in), b.mpi(k.out), k.red);
                             continue;
                           }
                           gp->withAlgorithm(b, op, b.mpi(k.in), k.red, [&](algo::Context& c) {
                             algo::reduceScatter(c, *ours, b.mpi(k.in), b.mpi(k.out));
                           });
                         }
                       }},
                  opts.reduceOp);
}

}  // namespace mpigpu::ops
