// torch's collective time estimate (torch.distributed._time_estimator; torch's compiler asks it
// to reorder communication): between _start_time_estimate and _end_time_estimate, a group's ops
// issued on the thread that started it are checked and planned as usual (argument errors still
// raise) but not run. Each returns a completed Work and adds what an alpha-beta model predicts
// for it; the end returns the sum in microseconds, the unit of NCCL's estimate (ncclSimInfo_t's
// estimatedTime, which torch's inductor divides by 1e3). Unlike NCCL's, point-to-point ops count.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ops/OpPlan.hpp"

namespace mpigpu::ops {

// One link of the model: per message and per byte (TORCH_MPIGPU_COST_* settings).
struct CostLink {
  double latencyUs;
  double bytesPerUs;
};

// The link a group's messages take: across nodes where its ranks span them (the slowest link
// paces every step of a ring), else inside one.
CostLink costLink(const Group& g);

// Microseconds the model predicts for one op of `type` over `bytes` (the op's size, as
// nccl-tests counts it: all_gather's whole output, reduce_scatter's and all_to_all's whole
// input) in a group of `size` ranks: steps x latency + bytes on the busiest link / bandwidth.
double predictedUs(c10d::OpType type, double bytes, int size, const CostLink& link);

class TimeEstimate {
 public:
  // The hot path's one check: an estimate is open and this is the thread that opened it (as
  // NCCL's group calls, the estimate is per thread: other threads' ops run).
  bool active() const {
    return on_.load(std::memory_order_acquire) &&
           owner_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }
  // Opens an estimate on this thread. One still open (torch's _time_estimator skips the end when
  // its body raises) is dropped, with a warning.
  void start(const std::string& logPrefix);
  // Closes it: the predicted microseconds of the ops issued since start.
  float end(const Group& g);
  // The op, planned and checked, not run: its prediction added (the group hands back a completed
  // Work for it).
  void add(const Group& g, const Plan& plan);
  void addP2P(const Group& g, c10d::OpType type, const at::Tensor& tensor);

 private:
  void added(double us);

  std::atomic<bool> on_{false};
  std::atomic<std::thread::id> owner_{};
  std::mutex mutex_;  // the sums (end may come from another thread than the ops)
  double totalUs_ = 0;
  int64_t ops_ = 0;
};

}  // namespace mpigpu::ops
