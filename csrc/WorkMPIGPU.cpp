#include "WorkMPIGPU.hpp"

#include <atomic>
#include <memory>

#include "Errors.hpp"
#include "engine/FutureCompleter.hpp"

namespace mpigpu {

WorkMPIGPU::WorkMPIGPU(int rank, c10d::OpType type, const char* opName, uint64_t seq,
                       std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                       const char* profilingTitle,
                       const std::optional<std::vector<at::Tensor>>& inputs)
    : Work(rank, type, profilingTitle, inputs),
      opName_(opName),
      seq_(seq),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))),
      created_(std::chrono::steady_clock::now()) {}

bool WorkMPIGPU::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
    MPIGPU_THROW_BACKEND(opName_, rank_, "op #", seq_, " did not complete within ",
                         limit.count(), " ms. Another rank is probably not calling this op (or "
                         "calls ops in a different order); the op keeps running, and the MPI "
                         "call cannot be cancelled, so the job should be stopped.");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

int WorkMPIGPU::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(completed_, opMessage(opName_, rank_, "sourceRank() asked before the receive "
                                                    "completed; call wait() first"));
  return sourceRank_;
}

float WorkMPIGPU::getDuration() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!completed_) return -1.0f;
  const auto start = started_.time_since_epoch().count() ? started_ : created_;
  return std::chrono::duration<float, std::milli>(finished_ - start).count();
}

void WorkMPIGPU::markCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = std::chrono::steady_clock::now();
  }
  finish();
  completeFutureAsync([future = future_, outputs = outputs_] {
    future->markCompleted(c10::IValue(outputs));
  });
  runDoneCallbacks();
}

void WorkMPIGPU::markFailed(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = std::chrono::steady_clock::now();
  }
  finish(error);
  completeFutureAsync([future = future_, error] { future->setError(error); });
  runDoneCallbacks();
}

void WorkMPIGPU::onDone(std::function<void(WorkMPIGPU&)> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      doneCallbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn(*this);
}

void WorkMPIGPU::runDoneCallbacks() {
  std::vector<std::function<void(WorkMPIGPU&)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    callbacks.swap(doneCallbacks_);
  }
  for (auto& fn : callbacks) fn(*this);
}

c10::intrusive_ptr<WorkMPIGPU> combineWorks(
    int rank, const char* opName, uint64_t seq,
    const std::vector<c10::intrusive_ptr<WorkMPIGPU>>& parts, std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> outputs;
  for (const auto& p : parts) {
    for (auto& t : p->result()) outputs.push_back(t);
  }
  auto whole = c10::make_intrusive<WorkMPIGPU>(rank, c10d::OpType::COALESCED, opName, seq,
                                               std::move(outputs), timeout, nullptr, std::nullopt);
  if (parts.empty()) {
    whole->markCompleted();
    return whole;
  }
  struct State {
    std::atomic<size_t> left;
    std::mutex mutex;
    std::exception_ptr firstError;
  };
  auto state = std::make_shared<State>();
  state->left = parts.size();
  for (const auto& p : parts) {
    p->onDone([state, whole](WorkMPIGPU& part) {
      if (auto e = part.exception()) {
        std::lock_guard<std::mutex> lock(state->mutex);
        if (!state->firstError) state->firstError = e;
      }
      if (--state->left == 0) {
        if (state->firstError) whole->markFailed(state->firstError);
        else whole->markCompleted();
      }
    });
  }
  return whole;
}

} // namespace mpigpu
