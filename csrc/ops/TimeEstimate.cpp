// The time estimate's model and bookkeeping (ops/TimeEstimate.hpp).
#include "ops/TimeEstimate.hpp"

#include <c10/util/Logging.h>

#include <cmath>
#include <utility>

#include "core/Errors.hpp"

namespace mpigpu::ops {

namespace {

// Bytes of a tensor list; a sparse tensor's are its indices' and values'.
double bytesOfAll(const std::vector<at::Tensor>& tensors) {
  double total = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    total += t.is_sparse() ? static_cast<double>(t._indices().nbytes() + t._values().nbytes())
                           : static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
  }
  return total;
}

// An op's steps (messages one after another) and the bytes its busiest link carries, for the
// algorithms mpigpu's collectives take or match in shape: a ring for all_reduce, all_gather and
// reduce_scatter, binomial trees for broadcast, reduce, gather, scatter and barrier, pairwise
// exchange for all_to_all.
struct Shape {
  double steps;
  double bytes;
};

Shape shapeOf(c10d::OpType type, double n, int size) {
  const double p = size;
  const double tree = std::ceil(std::log2(p));  // 0 at one rank: no message
  switch (type) {
    case c10d::OpType::ALLREDUCE:
    case c10d::OpType::ALLREDUCE_COALESCED: return {2 * (p - 1), 2 * (p - 1) / p * n};
    case c10d::OpType::BROADCAST:
    case c10d::OpType::REDUCE: return {tree, tree * n};
    case c10d::OpType::ALLGATHER:
    case c10d::OpType::_ALLGATHER_BASE:
    case c10d::OpType::ALLGATHER_COALESCED:
    case c10d::OpType::REDUCE_SCATTER:
    case c10d::OpType::_REDUCE_SCATTER_BASE:
    case c10d::OpType::ALLTOALL:
    case c10d::OpType::ALLTOALL_BASE: return {p - 1, (p - 1) / p * n};
    case c10d::OpType::GATHER:
    case c10d::OpType::SCATTER: return {tree, (p - 1) / p * n};
    case c10d::OpType::BARRIER: return {tree, 0};
    case c10d::OpType::SEND:
    case c10d::OpType::RECV:
    case c10d::OpType::RECVANYSOURCE: return {1, n};
    default:
      TORCH_INTERNAL_ASSERT(false, "mpigpu: the time estimate has no model for op type ",
                            c10d::opTypeToString(type), " (csrc/ops/TimeEstimate.cpp)");
  }
}

// The op's size as nccl-tests counts it (the same on every rank but for uneven all_to_all):
// the tensor for all_reduce, broadcast and reduce; the whole of the p blocks for the others.
double sizeOf(const Plan& plan, int size) {
  switch (plan.type) {
    case c10d::OpType::ALLGATHER:
    case c10d::OpType::_ALLGATHER_BASE:
    case c10d::OpType::ALLGATHER_COALESCED: return bytesOfAll(plan.outputs);
    case c10d::OpType::GATHER:
      return size * bytesOfAll(plan.inputs);  // (only the root holds the outputs)
    case c10d::OpType::SCATTER: return size * bytesOfAll(plan.outputs);
    default: return bytesOfAll(plan.inputs);
  }
}

}  // namespace

CostLink costLink(const Group& g) {
  const Config& c = g.config;
  return g.spansNodes ? CostLink{c.costAcrossLatencyUs, c.costAcrossBytesPerUs}
                      : CostLink{c.costLatencyUs, c.costBytesPerUs};
}

double predictedUs(c10d::OpType type, double bytes, int size, const CostLink& link) {
  const Shape s = shapeOf(type, bytes, size);
  return s.steps * link.latencyUs + s.bytes / link.bytesPerUs;
}

void TimeEstimate::start(const std::string& logPrefix) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (on_.load(std::memory_order_relaxed)) {
    LOG(WARNING) << logPrefix << "_start_time_estimate: the previous estimate was never ended "
                 << "(torch's _time_estimator skips the end when its body raises), so its " << ops_
                 << " op(s) were estimated and not run; starting a new one";
  }
  totalUs_ = 0;
  ops_ = 0;
  owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  on_.store(true, std::memory_order_release);
}

float TimeEstimate::end(const Group& g) {
  std::lock_guard<std::mutex> lock(mutex_);
  MPIGPU_CHECK_VALUE(on_.load(std::memory_order_relaxed), "_end_time_estimate", g.rank,
                     "no time estimate is open on this group; call _start_time_estimate first "
                     "(torch.distributed._time_estimator calls both)");
  on_.store(false, std::memory_order_release);
  return static_cast<float>(totalUs_);
}

void TimeEstimate::add(const Group& g, const Plan& plan) {
  const bool sparse =
      !plan.inputs.empty() && plan.inputs[0].defined() && plan.inputs[0].is_sparse();
  // A sparse all_reduce gathers every rank's indices and values.
  const double us = sparse ? predictedUs(c10d::OpType::ALLGATHER, g.size * bytesOfAll(plan.inputs),
                                         g.size, costLink(g))
                           : predictedUs(plan.type, sizeOf(plan, g.size), g.size, costLink(g));
  added(us);
}

void TimeEstimate::addP2P(const Group& g, c10d::OpType type, const at::Tensor& tensor) {
  added(predictedUs(type, bytesOfAll({tensor}), g.size, costLink(g)));
}

void TimeEstimate::added(double us) {
  std::lock_guard<std::mutex> lock(mutex_);
  totalUs_ += us;
  ++ops_;
}

}  // namespace mpigpu::ops
