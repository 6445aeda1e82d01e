// The Work (and its future) handed back for every op: completion, exception, timeout, the source
// rank of a receive-from-any, and for device tensors the stream order: wait() and the future
// order the caller's streams after the op.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <memory>
#include <vector>

#include "paths/OpBuffers.hpp"

namespace mpigpu {

// What lets wait() drive MPI progress itself (point-to-point); the group's engine implements it.
class ProgressDriver {
 public:
  virtual ~ProgressDriver() = default;
  // A caller is (or stops) testing for completion: the worker thread backs off meanwhile, so
  // the two do not fight over the cores.
  virtual void callerWaiting(bool waiting) = 0;
  // Tests the pending requests once (skipped if another thread is testing them).
  virtual void assistProgress() = 0;
  // How long a caller may test for completion itself before sleeping: zero when the host is
  // oversubscribed (then only the worker polls, and it sleeps between polls).
  virtual std::chrono::microseconds callerSpin() const = 0;
};

class WorkMPIGPU : public c10d::Work {
 public:
  // An op's buffers: one for most ops (kept inline, no allocation), several for a coalesced one.
  using Buffers = c10::SmallVector<std::shared_ptr<paths::OpBuffers>, 1>;
  // `profilingTitle` and `inputs` open torch's profiler event for the op: pass them only while a
  // profiler is active (profilerActive()); otherwise torch's Work would allocate one to find out.
  WorkMPIGPU(int rank, c10d::OpType type, const char* opName, uint64_t seq,
             std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
             const char* profilingTitle, const std::optional<std::vector<at::Tensor>>& inputs,
             Buffers buffers = {});

  // With no timeout argument the op's timeout (the group's, or the op option) applies: a op that
  // has not finished by then raises DistBackendError naming it, instead of waiting forever.
  // For device tensors it then makes the current stream wait for the results (MPI is blocking
  // on the host, so the op itself must be finished first).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // Sleeps until the op completed or failed (true), or `timeout` passed (false); never throws.
  // For the engine's own waits: no polling (a thread that wakes every millisecond beside one
  // spinning inside MPI on the same core stalled Open MPI 5 for good, see runAndWait).
  bool waitSettled(std::chrono::milliseconds timeout);
  // Orders the current stream after a completed op (no-op for host tensors).
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputsNow(); }
  // Until holdOutputsWeakly(): what result() returns, without a copy.
  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  // For an op that completed on the caller's thread, before the group hands the Work back: the
  // Work keeps its outputs as weak references (result() and the future still give them while the
  // caller holds them). torch destroys a Work with the GIL released, and dropping a tensor's last
  // C++ reference there takes the GIL back to release its Python object (torch 2.13+: PyObject
  // preservation), a GIL round trip per small op; dropped here, before the caller's own
  // references go, that happens where the caller's binding already holds the GIL.
  void holdOutputsWeakly();
  std::chrono::steady_clock::time_point createdAt() const { return created_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  int sourceRank() const override;
  uint64_t getSequencenumber() const override { return seq_; }
  int groupRank() const { return rank_; }  // for messages: the rank in the op's group
  float getDuration() const override;

  const char* opName() const { return opName_; }
  // The group this op belongs to, for describe() (the group sets it when it builds the Work).
  void setContext(std::string group, int worldRank) {
    group_ = std::move(group);
    worldRank_ = worldRank;
  }
  const std::string& group() const { return group_; }
  // One line for messages: "collective #5 of group '0' (group rank 1, world rank 3; 1024
  // elements of Float; timeout 1800000 ms)".
  std::string describe() const;
  void setSourceRank(int r) { sourceRank_ = r; }
  // The op's entry in the flight recorder (engine/FlightRecorder.hpp), kept up to date by the
  // marks below.
  void setFlightRecord(uint64_t id) { flightRecord_ = id; }
  void markStarted();
  // Exactly one of these is called, once, by the engine.
  void markCompleted();
  void markFailed(std::exception_ptr error);
  // Runs `fn` when the work completes (at once if it already has): used to build one Work out of
  // several (coalescing).
  void onDone(std::function<void(WorkMPIGPU&)> fn);
  const Buffers& buffers() const { return buffers_; }
  // For point-to-point: wait() first drives MPI progress itself (tests the group's pending
  // requests) for a short while, instead of sleeping until the worker thread notices the
  // completion and wakes it. Set before the work is handed out.
  void setProgressDriver(std::weak_ptr<ProgressDriver> driver) { driver_ = std::move(driver); }
  const std::weak_ptr<ProgressDriver>& progressDriver() const { return driver_; }
  // Set once someone waits for the op (wait() or its future): the watchdog judges a pending
  // send or receive only then (one posted and never waited for may go unmatched harmlessly).
  // Point-to-point ops only (null for collectives).
  std::shared_ptr<const std::atomic<bool>> awaited() const { return awaited_; }

 private:
  void runDoneCallbacks();
  std::vector<at::Tensor> outputsNow() const;
  // From the start (or creation) to the finish: with mutex_ held, or by the thread settling it.
  float ranMsLocked() const;
  void completeFuture();  // with futureMutex_ held

  const char* opName_;
  const uint64_t seq_;
  const std::shared_ptr<std::atomic<bool>> awaited_;
  std::string group_;
  int worldRank_ = -1;
  // Completed or failed once: abort() may fail an op whose MPI call returns later.
  std::atomic<bool> settled_{false};
  // Set once finish() has published the outcome (exception_ included): wait() reads it unlocked.
  std::atomic<bool> published_{false};
  std::vector<at::Tensor> outputs_;
  using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  c10::SmallVector<WeakTensor, 1> weakOutputs_;  // outputs_ once held weakly (then empty)
  const std::chrono::milliseconds timeout_;
  const Buffers buffers_;
  // Made by the first getFuture() (most ops are never asked for one): until then nobody can have
  // attached a callback, so settling it waits for that request instead of the completer pool.
  // futureMutex_ makes "not requested yet, so leave it to getFuture()" atomic against it.
  c10::intrusive_ptr<c10::ivalue::Future> makeFuture() const;
  std::mutex futureMutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // guarded by futureMutex_
  bool futureDeferred_ = false;  // settled before getFuture(): the future is settled on request
  int sourceRank_ = -1;
  std::chrono::steady_clock::time_point created_, started_, finished_;
  std::vector<std::function<void(WorkMPIGPU&)>> doneCallbacks_;  // guarded by mutex_
  std::atomic<bool> hasDoneCallbacks_{false};                    // set with the first
  std::weak_ptr<ProgressDriver> driver_;  // empty: wait() just sleeps until completion
  uint64_t flightRecord_ = ~uint64_t{0};  // none
};

// One Work for several: completes when all have, failing with the first failure.
c10::intrusive_ptr<WorkMPIGPU> combineWorks(
    int rank, const char* opName, uint64_t seq,
    const std::vector<c10::intrusive_ptr<WorkMPIGPU>>& parts, std::chrono::milliseconds timeout);

}  // namespace mpigpu
