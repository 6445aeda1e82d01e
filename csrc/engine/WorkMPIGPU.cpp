#include "engine/WorkMPIGPU.hpp"

#include <sstream>

#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "core/Errors.hpp"
#include "engine/FlightRecorder.hpp"
#include "engine/FutureCompleter.hpp"

namespace mpigpu {
namespace {

// A CUDA-aware future records events on its devices' current streams when completed, and makes
// its consumers' streams wait for them; so it must know the devices.
std::vector<c10::Device> devicesOf(const WorkMPIGPU::Buffers& bufs) {
  std::vector<c10::Device> devices;
  for (const auto& b : bufs) {
    for (const auto& d : b->futureDevices()) {
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    }
  }
  return devices;
}

std::vector<c10::Stream> streamsOf(const WorkMPIGPU::Buffers& bufs) {
  std::vector<c10::Stream> streams;
  for (const auto& b : bufs) {
    auto s = b->completionStream();
    if (!s) continue;
    const bool seen = std::any_of(streams.begin(), streams.end(),
                                  [&](const c10::Stream& x) { return x.device() == s->device(); });
    if (!seen) streams.push_back(*s);
  }
  return streams;
}

}  // namespace

WorkMPIGPU::WorkMPIGPU(int rank, c10d::OpType type, const char* opName, uint64_t seq,
                       std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                       const char* profilingTitle,
                       const std::optional<std::vector<at::Tensor>>& inputs, Buffers buffers)
    : Work(rank, type, profilingTitle, inputs),
      opName_(opName),
      seq_(seq),
      awaited_(c10d::isP2POp(type) ? std::make_shared<std::atomic<bool>>(false) : nullptr),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      buffers_(std::move(buffers)),
      created_(std::chrono::steady_clock::now()) {}

std::vector<at::Tensor> WorkMPIGPU::outputsNow() const {
  if (weakOutputs_.empty()) return outputs_;
  std::vector<at::Tensor> now;
  now.reserve(weakOutputs_.size());
  for (const auto& w : weakOutputs_) now.emplace_back(w.lock());  // undefined once dropped
  return now;
}

void WorkMPIGPU::holdOutputsWeakly() {
  for (const auto& t : outputs_) weakOutputs_.emplace_back(t.getIntrusivePtr());
  outputs_.clear();
}

c10::intrusive_ptr<c10::ivalue::Future> WorkMPIGPU::makeFuture() const {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), devicesOf(buffers_));
}

std::string WorkMPIGPU::describe() const {
  std::ostringstream s;
  s << (c10d::isP2POp(retrieveOpType()) ? "point-to-point op #" : "collective #") << seq_;
  if (!group_.empty()) s << " of group '" << group_ << "'";
  s << " (group rank " << rank_;
  if (worldRank_ >= 0) s << ", world rank " << worldRank_;
  int64_t numel = 0;
  const auto outputs = outputsNow();
  for (const auto& t : outputs) numel += t.defined() ? t.numel() : 0;
  if (!outputs.empty() && outputs[0].defined()) {
    s << "; " << numel << " elements of " << outputs[0].scalar_type();
  }
  s << "; timeout " << timeout_.count() << " ms)";
  return s.str();
}

bool WorkMPIGPU::wait(std::chrono::milliseconds timeout) {
  if (awaited_) awaited_->store(true, std::memory_order_relaxed);
  if (published_.load(std::memory_order_acquire)) {  // settled already (an inline op): no lock
    if (exception_) std::rethrow_exception(exception_);
    synchronize();
    return true;
  }
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  if (auto driver = driver_.lock(); driver && !isCompleted()) {
    // A reply usually lands within microseconds: test for it here rather than pay a thread
    // wake-up. Bounded, then the worker's polling takes over.
    const auto spin = std::min<std::chrono::microseconds>(driver->callerSpin(), limit);
    if (spin.count() > 0) {
      const auto spinUntil = std::chrono::steady_clock::now() + spin;
      driver->callerWaiting(true);
      while (!isCompleted() && std::chrono::steady_clock::now() < spinUntil) {
        driver->assistProgress();
        std::this_thread::yield();
      }
      driver->callerWaiting(false);
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  // (completed_ first: an inline op has finished by now, and wait_for reads the clock)
  if (!completed_ && !cv_.wait_for(lock, limit, [&] { return completed_; })) {
    MPIGPU_THROW_BACKEND(opName_, rank_, describe(), " did not complete within ", limit.count(),
                         " ms. Another rank is probably not calling this op (or "
                         "calls ops in a different order); the op keeps running, and the MPI "
                         "call cannot be cancelled, so the job should be stopped.");
  }
  if (exception_) std::rethrow_exception(exception_);
  lock.unlock();
  synchronize();
  return true;
}

bool WorkMPIGPU::waitSettled(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return completed_; });
}

void WorkMPIGPU::synchronize() {
  for (const auto& b : buffers_) b->orderCurrentStream();
}

c10::intrusive_ptr<c10::ivalue::Future> WorkMPIGPU::getFuture() {
  if (awaited_) awaited_->store(true, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(futureMutex_);
  if (!future_) future_ = makeFuture();
  if (futureDeferred_) {  // the op settled before anyone asked: settle the future now
    futureDeferred_ = false;
    if (auto error = exception())
      future_->setError(error);
    else
      completeFuture();
  }
  return future_;
}

int WorkMPIGPU::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(completed_, opMessage(opName_, rank_,
                                    "sourceRank() asked before the receive "
                                    "completed; call wait() first"));
  return sourceRank_;
}

float WorkMPIGPU::getDuration() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!completed_) return -1.0f;
  return ranMsLocked();
}

float WorkMPIGPU::ranMsLocked() const {
  const auto start = started_.time_since_epoch().count() ? started_ : created_;
  return std::chrono::duration<float, std::milli>(finished_ - start).count();
}

void WorkMPIGPU::markStarted() {
  started_ = std::chrono::steady_clock::now();
  fr::Recorder::get().started(flightRecord_, started_);
}

void WorkMPIGPU::markCompleted() {
  if (settled_.exchange(true)) return;  // already failed by abort()
  // Written once, here, before finish() publishes completed_ under mutex_: getDuration() reads
  // it only after seeing completed_ under the same lock.
  finished_ = std::chrono::steady_clock::now();
  fr::Recorder::get().finished(flightRecord_, finished_, ranMsLocked());
  finish();
  published_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(futureMutex_);
    if (!future_) {
      // Nobody asked for the future, so nobody can have attached a callback: leave building it
      // and its value (a list of every output) to getFuture(), if anyone ever asks.
      futureDeferred_ = true;
      return runDoneCallbacks();
    }
  }
  completeFutureAsync([future = future_, outputs = result(), streams = streamsOf(buffers_)] {
    // With the comm streams current, the future's events mark the op's end on them.
    c10::MultiStreamGuard onCommStreams(streams);
    future->markCompleted(c10::IValue(outputs));
  });  // callbacks may block: not on the engine thread
  runDoneCallbacks();
}

void WorkMPIGPU::completeFuture() {
  // With the comm streams current, the future's events mark the op's end on them (recorded now,
  // after the op: later work on those streams can only make a consumer wait longer).
  c10::MultiStreamGuard onCommStreams(streamsOf(buffers_));
  future_->markCompleted(c10::IValue(result()));
}

void WorkMPIGPU::markFailed(std::exception_ptr error) {
  if (settled_.exchange(true)) return;
  finished_ = std::chrono::steady_clock::now();  // (as in markCompleted)
  fr::Recorder::get().finished(flightRecord_, finished_, ranMsLocked());
  finish(error);
  published_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(futureMutex_);
    if (!future_) {
      futureDeferred_ = true;  // getFuture() sets the error on the future it makes
      return runDoneCallbacks();
    }
  }
  completeFutureAsync([future = future_, error] { future->setError(error); });
  runDoneCallbacks();
}

void WorkMPIGPU::onDone(std::function<void(WorkMPIGPU&)> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      doneCallbacks_.push_back(std::move(fn));
      hasDoneCallbacks_.store(true, std::memory_order_release);
      return;
    }
  }
  fn(*this);
}

void WorkMPIGPU::runDoneCallbacks() {
  // After finish() no callback can be added (onDone sees completed_): none so far, none ever.
  if (!hasDoneCallbacks_.load(std::memory_order_acquire)) return;
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
  WorkMPIGPU::Buffers buffers;
  for (const auto& p : parts) {
    for (auto& t : p->result()) outputs.push_back(t);
    for (const auto& b : p->buffers()) buffers.push_back(b);
  }
  auto whole = c10::make_intrusive<WorkMPIGPU>(rank, c10d::OpType::COALESCED, opName, seq,
                                               std::move(outputs), timeout, nullptr, std::nullopt,
                                               std::move(buffers));
  if (parts.empty()) {
    whole->markCompleted();
    return whole;
  }
  struct State {
    std::atomic<size_t> left;
    std::mutex mutex;
    std::exception_ptr firstError;
  };
  // Parts that are point-to-point drive progress while the whole is waited for (one engine
  // pass serves them all, so the first part's assist is enough).
  for (const auto& p : parts) {
    if (!p->progressDriver().expired()) {
      whole->setProgressDriver(p->progressDriver());
      break;
    }
  }
  auto state = std::make_shared<State>();
  state->left = parts.size();
  for (const auto& p : parts) {
    p->onDone([state, whole](WorkMPIGPU& part) {
      if (auto e = part.exception()) {
        std::lock_guard<std::mutex> lock(state->mutex);
        if (!state->firstError) state->firstError = e;
      }
      if (--state->left == 0) {
        if (state->firstError)
          whole->markFailed(state->firstError);
        else
          whole->markCompleted();
      }
    });
  }
  return whole;
}

}  // namespace mpigpu
