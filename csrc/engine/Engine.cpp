#include "engine/Engine.hpp"
#include "engine/ThreadName.hpp"

#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <optional>
#include <thread>

#include <ATen/core/grad_mode.h>

#include <sys/prctl.h>

#include "core/Errors.hpp"
#include "core/KeepUntilExit.hpp"
#include "mpi/Check.hpp"
#include "mpi/Collectives.hpp"
#include "mpi/Env.hpp"
#include "mpi/FaultTolerance.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu {

namespace {
// An MPI error inside an op's task names the op, the rank and the MPI call; add which op of which
// group it was (sequence number, group, world rank, sizes), as the engine's own errors do.
std::exception_ptr withOpContext(const WorkMPIGPU& work, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::DistBackendError& e) {
    return std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        std::string(e.what_without_backtrace()) + " [" + work.describe() + "]"));
  } catch (...) {
    return error;
  }
}

std::exception_ptr failedWith(const WorkMPIGPU& work, const std::string& why) {
  return std::make_exception_ptr(
      c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                            opMessage(work.opName(), work.groupRank(), work.describe(), " ", why)));
}

constexpr const char* kShutDown =
    "the process group has been shut down (destroyed, or the interpreter is exiting); create a "
    "new one";
constexpr const char* kAborted = "the process group was aborted (its abort()); create a new one";
}  // namespace
namespace {

std::mutex g_registryMutex;
std::vector<std::weak_ptr<Engine>> g_engines;
std::weak_ptr<Engine> g_shared;

// While point-to-point requests are outstanding the worker polls them every kPollInterval, and
// every kSlowPollInterval once nothing has moved for kSlowAfter (a receive posted long before its
// send, as in pipeline parallelism) or while a caller in wait() tests them itself (the usual
// case for host tensors: the reply is seen without any thread wake-up). It sleeps for good only
// after kSlowAfter without point-to-point traffic.
constexpr auto kPollInterval = std::chrono::microseconds(20);
constexpr auto kSlowAfter = std::chrono::milliseconds(10);
constexpr auto kSlowPollInterval = std::chrono::microseconds(200);
// How long wait() on a point-to-point op tests for completion itself before sleeping.
constexpr auto kCallerSpin = std::chrono::microseconds(2000);

}  // namespace

std::shared_ptr<Engine> Engine::create(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_registryMutex);
  if (mpi::needsSerializedAccess()) {
    if (auto shared = g_shared.lock()) {
      static bool warned = false;  // (under g_registryMutex)
      if (!warned) {
        warned = true;
        LOG(WARNING) << "mpigpu: MPI granted "
                     << mpi::threadLevelName(mpi::ensureInitialized().threadLevel)
                     << ", less than MPI_THREAD_MULTIPLE, so every process group shares one MPI "
                        "thread that runs their ops in the order this process issued them. Issue "
                        "ops on different groups in the same order on every rank: ops issued from "
                        "several threads on different groups can otherwise wait on each other "
                        "forever. Initialise MPI with MPI_THREAD_MULTIPLE to lift this.";
      }
      return shared;
    }
    auto engine = std::make_shared<Engine>("mpigpu-shared", /*shared=*/true);
    g_shared = engine;
    g_engines.push_back(engine);
    return engine;
  }
  auto engine = std::make_shared<Engine>(name, /*shared=*/false);
  g_engines.push_back(engine);
  return engine;
}

void Engine::shutdownAll() {
  std::vector<std::shared_ptr<Engine>> alive;
  {
    std::lock_guard<std::mutex> lock(g_registryMutex);
    for (auto& w : g_engines) {
      if (auto e = w.lock()) alive.push_back(e);
    }
    g_engines.clear();
  }
  // At interpreter exit a collective may still be queued (issued with async_op=True and never
  // waited). Its peers may already be inside it: dropping it would leave them there while this
  // rank sits in MPI_Finalize. So run what is queued first; if that does not finish in bounded
  // time, end the job with a message instead of hanging.
  constexpr auto kDrainTimeout = std::chrono::seconds(60);
  for (auto& e : alive) {
    std::string busy;
    if (!e->drain(kDrainTimeout, &busy) && !mpi::isFinalized()) {
      LOG(ERROR) << opMessage("exit", mpi::ensureInitialized().worldRank,
                              "the interpreter is exiting but ", busy, " did not finish within ",
                              kDrainTimeout.count(),
                              " s (another rank never issued it, or left "
                              "early); ending the job with MPI_Abort instead of hanging in "
                              "MPI_Finalize. Wait for async ops (work.wait()) and call "
                              "dist.destroy_process_group() before exiting.");
      mpi::abortJob(1);
    }
  }
  for (auto& e : alive) e->shutdown();
}

bool Engine::drain(std::chrono::milliseconds timeout, std::string* busy) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.notify_all();
  // Sleeps until the worker reports idle (idleCv_), never polls (see runAndWait).
  if (idleCv_.wait_for(lock, timeout,
                       [&] { return stop_ || (queue_.empty() && !running_ && !inlineBusy_); })) {
    return true;
  }
  if (busy != nullptr) {
    *busy = queue_.empty() ? std::string("an op running on group engine ") + name_
                           : c10::str(queue_.size(), " queued op(s) of ", name_, ", the first ",
                                      queue_.front().work->opName());
  }
  return false;
}

Engine::Engine(std::string name, bool shared)
    : name_(std::move(name)),
      shared_(shared),
      serialized_(mpi::needsSerializedAccess()),
      thread_([this] { loop(); }) {}

Engine::~Engine() { shutdown(); }

bool Engine::stopped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_;
}

void Engine::submit(c10::intrusive_ptr<WorkMPIGPU> work, Task task) {
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stop_) {
      queue_.push_back({std::move(work), std::move(task)});
      cv_.notify_one();
      return;
    }
    refused = stopReason_;
  }
  work->markFailed(std::make_exception_ptr(
      c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                            opMessage(work->opName(), work->groupRank(), refused))));
}

bool Engine::endInline() {
  std::lock_guard<std::mutex> lock(mutex_);
  inlineBusy_ = false;
  inlineWork_.reset();
  idleCv_.notify_all();
  return !queue_.empty();  // a thread queued an op meanwhile and the worker skipped it: wake it
}

bool Engine::tryInline(const c10::intrusive_ptr<WorkMPIGPU>& work, c10::function_ref<bool()> task,
                       Inline kind) {
  const bool post = kind == Inline::Post;
  // Posting while the worker may be testing requests needs MPI_THREAD_MULTIPLE.
  if (post && serialized_) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_ || running_ || inlineBusy_ || !queue_.empty()) return false;
    // A collective also waits for pending requests: the worker would test them meanwhile.
    if (!post && pendingCount_.load() != 0) return false;
    inlineBusy_ = true;  // the worker starts nothing queued meanwhile: issue order holds
    inlineWork_ = work;
  }
  work->markStarted();
  try {
    at::NoGradGuard noGrad;  // as on the worker: writing results into parameters is not autograd
    bool done = false;
    {
      mpi::SerialGuard inMpi;  // (serialized: beside the store's calls, mpi/Wait.hpp)
      done = task();
    }
    TORCH_INTERNAL_ASSERT(done || post, "mpigpu: an inline collective left MPI requests pending");
    if (done) work->markCompleted();
  } catch (...) {
    work->markFailed(withOpContext(*work, std::current_exception()));
  }
  if (endInline()) cv_.notify_all();  // ops queued meanwhile by other threads
  return true;
}

void Engine::assistProgress() {
  if (serialized_ || pendingCount_.load() == 0) return;
  at::NoGradGuard noGrad;  // a receive copied back into a tensor that requires grad
  progressPending(/*blocking=*/false);
}

std::chrono::microseconds Engine::callerSpin() const {
  // Below THREAD_MULTIPLE the caller may not test (assistProgress does nothing): sleep at once.
  // Crowded (more ranks than cores, mpi/Wait.hpp): only the worker tests, sleeping in between.
  if (serialized_ || mpi::crowded()) return std::chrono::microseconds(0);
  return kCallerSpin;
}

void Engine::callerWaiting(bool waiting) {
  if (serialized_) return;
  if (waiting) {
    ++callersWaiting_;
    return;
  }
  --callersWaiting_;  // the worker resumes polling at its next look (within kSlowPollInterval)
}

bool Engine::runAndWait(const char* opName, const std::string& group, int rank,
                        std::function<void()> task, std::chrono::milliseconds timeout,
                        const std::function<std::string()>& peerFailed) {
  auto work =
      c10::make_intrusive<WorkMPIGPU>(rank, c10d::OpType::UNKNOWN, opName, 0,
                                      std::vector<at::Tensor>{}, timeout, nullptr, std::nullopt);
  work->setContext(group, /*worldRank=*/-1);  // abortGroup() finds the group's ops by name
  submit(work, [task = std::move(task)] {
    task();
    return true;
  });
  // Sleep on the Work, without Work::wait's timeout error: the caller decides what a timeout
  // means. Never a polling loop: Open MPI 5 (TCP, two ranks bound to one core, as a hostfile
  // of two hosts gives) stalled for good, no packet moving, while this thread woke every
  // millisecond beside the worker spinning inside MPI; plain mpi4py does the same (#25).
  // (`peerFailed`: a wake-up every 200 ms, only where ULFM is on.)
  if (!peerFailed || shared_) {
    if (!work->waitSettled(timeout)) return false;
  } else if (!waitUnlessPeerFailed(*work, timeout, opName, rank, peerFailed)) {
    return false;
  }
  work->wait();  // rethrows the task's error
  return true;
}

bool Engine::waitUnlessPeerFailed(WorkMPIGPU& work, std::chrono::milliseconds timeout,
                                  const char* opName, int rank,
                                  const std::function<std::string()>& peerFailed) {
  constexpr auto kSlice = std::chrono::milliseconds(200);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!work.waitSettled(kSlice)) {
    const std::string why = peerFailed();
    if (!why.empty()) {
      abort(c10::str(opName, " gave up: ", why), /*peerFailed=*/true);
      MPIGPU_THROW_BACKEND(opName, rank, why);
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
  return true;
}

void Engine::addPending(std::vector<MPI_Request> requests, c10::intrusive_ptr<WorkMPIGPU> work,
                        Then then) {
  {
    std::lock_guard<std::mutex> lock(progressMutex_);
    pending_.push_back({std::move(requests), std::move(work), std::move(then)});
    pendingCount_ = pending_.size();
    lastProgress_ = std::chrono::steady_clock::now().time_since_epoch().count();
  }
  wakeToPoll();
}

void Engine::wakeToPoll() {
  // Posted from a caller's thread while the worker sleeps for good: wake it to poll. (Otherwise
  // it looks within kSlowPollInterval, and a waiting caller tests sooner.) The lock orders this
  // check against the worker's between its predicate and its wait.
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wake = deepSleep_;
  }
  if (wake) cv_.notify_all();
}

void Engine::addHeldReceive(HeldReceive receive, c10::intrusive_ptr<WorkMPIGPU> work, Then then) {
  {
    std::lock_guard<std::mutex> lock(progressMutex_);
    const bool behind = std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) {
      return p.held && p.held->comm == receive.comm && p.held->tag == receive.tag;
    });
    Pending p{{}, std::move(work), std::move(then), {}, std::nullopt};
    if (receive.source == MPI_ANY_SOURCE || behind) {
      p.held = std::move(receive);
    } else {
      p.requests = receive.post(nullptr);  // a throw fails the op (nothing was added)
    }
    pending_.push_back(std::move(p));
    pendingCount_ = pending_.size();
    lastProgress_ = std::chrono::steady_clock::now().time_since_epoch().count();
  }
  wakeToPoll();
}

void Engine::failHeldReceives(MPI_Comm comm, const std::string& why) {
  std::vector<Pending> failed;
  {
    std::lock_guard<std::mutex> lock(progressMutex_);
    for (size_t i = 0; i < pending_.size();) {
      if (pending_[i].held && pending_[i].held->comm == comm) {
        failed.push_back(std::move(pending_[i]));
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    pendingCount_ = pending_.size();
  }
  for (auto& p : failed) failUnposted(p, failedWith(*p.work, why));
}

void Engine::failUnposted(Pending& p, std::exception_ptr error) {
  MPI_Status status{};
  status.MPI_ERROR = MPI_ERR_OTHER;
  if (p.then) p.then(status);  // releases its buffers, copies nothing back
  p.work->markFailed(std::move(error));
}

void Engine::postHeldReceives(std::vector<std::pair<Pending, std::exception_ptr>>& failed) {
  std::vector<std::pair<MPI_Comm, int>> stillHeld;  // (comm, tag) with an unmatched receive
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    if (!p.held) continue;
    const std::pair<MPI_Comm, int> key{p.held->comm, p.held->tag};
    if (std::find(stillHeld.begin(), stillHeld.end(), key) != stillHeld.end()) continue;
    try {
      MPI_Message message = MPI_MESSAGE_NULL;
      if (p.held->source == MPI_ANY_SOURCE) {
        int found = 0;
        MPI_Status status;
        MPIGPU_MPI_CHECK(
            MPI_Improbe(MPI_ANY_SOURCE, p.held->tag, p.held->comm, &found, &message, &status),
            p.work->opName(), p.work->groupRank());
        if (!found) {
          stillHeld.push_back(key);
          continue;
        }
      }
      p.requests = p.held->post(message == MPI_MESSAGE_NULL ? nullptr : &message);
      p.held.reset();
    } catch (...) {
      failed.emplace_back(std::move(p), std::current_exception());
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i--));
    }
  }
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return;
    stop_ = true;
    stopReason_ = kShutDown;
    cv_.notify_all();
    idleCv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  failOutstanding([](const WorkMPIGPU&) {
    return "was still outstanding when the process group was shut down";
  });
}

namespace {
std::atomic<int> g_stuckWorkers{0};

}  // namespace

bool Engine::anyStuckInMpi() { return g_stuckWorkers.load() > 0; }

bool Engine::leftInsideMpi() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return leftInside_;
}

bool Engine::abort(const std::string& why, bool peerFailed) {
  return abortAll([why](const WorkMPIGPU&) { return why; }, kAborted, peerFailed);
}

bool Engine::abortAll(const WhyFor& why, const std::string& stopReason, bool peerFailed) {
  bool insideTask;
  bool inlineRunning;
  c10::intrusive_ptr<WorkMPIGPU> running;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_ && !thread_.joinable()) return true;
    stop_ = true;
    stopReason_ = stopReason;
    idleCv_.notify_all();
    insideTask = running_;
    inlineRunning = inlineBusy_;
    running = current_ ? current_ : inlineWork_;
    cv_.notify_all();
  }
  // Below MPI_THREAD_MULTIPLE no thread may call MPI (cancel) while another is inside it.
  failOutstanding(why, /*mayCallMpi=*/!(serialized_ && (insideTask || inlineRunning)));
  if (running) {
    running->markFailed(std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        opMessage(running->opName(), running->groupRank(), running->describe(), " ", why(*running),
                  " while inside MPI (the call itself cannot be interrupted)"))));
  }
  if (thread_.joinable() && !onWorkerThread()) {
    if (insideTask) {
      // Blocked in MPI (a collective its peers never joined): it cannot be interrupted. Leave it;
      // the caller keeps this engine alive, and the process cannot finalise MPI (see exit).
      thread_.detach();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        leftInside_ = true;
      }
      if (!peerFailed) ++g_stuckWorkers;
      return false;
    }
    thread_.join();
  }
  return true;
}

bool Engine::abortGroup(const std::string& group, const std::string& why) {
  if (!shared_) return abort(why);
  auto ofGroup = [&](const c10::intrusive_ptr<WorkMPIGPU>& w) { return w && w->group() == group; };
  std::deque<Queued> dropped;
  c10::intrusive_ptr<WorkMPIGPU> blocking;  // the group's op inside MPI, if any
  bool stopped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped = stop_;
    if (running_ && ofGroup(current_)) blocking = current_;
    if (inlineBusy_ && ofGroup(inlineWork_)) blocking = inlineWork_;
    if (!stopped && !blocking) {
      std::deque<Queued> kept;
      for (auto& q : queue_) (ofGroup(q.work) ? dropped : kept).push_back(std::move(q));
      queue_.swap(kept);
    }
  }
  if (stopped || blocking) {
    const std::string blocker = blocking ? blocking->describe() : std::string("an op");
    const std::string others = c10::str(
        "failed: the one thread that may call MPI here (MPI grants less than "
        "MPI_THREAD_MULTIPLE, so every group shares it) is blocked inside ",
        blocker, ", which was aborted and cannot be interrupted; no other op can run");
    return abortAll(
        [=](const WorkMPIGPU& w) { return w.group() == group ? why : others; },
        c10::str("MPI is blocked inside an aborted op of group '", group,
                 "' (every group shares one MPI thread here); no op can run in this process"));
  }
  for (auto& q : dropped) q.work->markFailed(failedWith(*q.work, why));
  {
    std::lock_guard<std::mutex> lock(progressMutex_);
    for (auto& p : pending_) {
      if (ofGroup(p.work)) p.abortedWhy = why;  // cancelled and failed by the worker
    }
  }
  cv_.notify_all();
  return true;
}

void Engine::failOutstanding(const WhyFor& why, bool mayCallMpi) {
  std::deque<Queued> orphans;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    orphans.swap(queue_);
  }
  std::vector<Pending> abandoned;
  {
    std::lock_guard<std::mutex> lock(progressMutex_);
    abandoned.swap(pending_);
    pendingCount_ = 0;
  }
  for (auto& q : orphans) q.work->markFailed(failedWith(*q.work, why(*q.work)));
  std::optional<mpi::SerialGuard> inMpi;  // (not while another thread may block inside MPI)
  if (mayCallMpi && !abandoned.empty()) inMpi.emplace();
  for (auto& p : abandoned) {
    cancelOrKeep(p, mayCallMpi);
    p.work->markFailed(failedWith(*p.work, p.abortedWhy.empty() ? why(*p.work) : p.abortedWhy));
  }
}

void Engine::cancelOrKeep(Pending& p, bool mayCallMpi) {
  // A receive left posted would let MPI write into a tensor the user owns again.
  if (!mayCallMpi || !mpi::cancelRequests(p.requests)) {
    for (const auto& t : p.work->result()) keepUntilExit(t);
    keepUntilExit(std::move(p.then));  // holds the op's staging buffers
  }
}

void Engine::cancelMarkedPending(std::vector<Pending>& failed) {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    if (p.abortedWhy.empty()) {
      ++i;
      continue;
    }
    cancelOrKeep(p, /*mayCallMpi=*/true);  // (on the worker)
    failed.push_back(std::move(p));
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (!failed.empty()) pendingCount_ = pending_.size();
}

void Engine::loop() {
  setThreadName("mpigpu-engine");
  // Ops write into tensors that may require grad (parameters, gradients); that is not autograd.
  at::NoGradGuard noGrad;
  // Linux lets a 20 us timed wait oversleep by the default 50 us timer slack; poll on time.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  while (true) {
    Queued item;
    // On stop, queued ops and outstanding requests are failed by shutdown() or abort(): the
    // peers may never post their side.
    if (!waitForWork(item)) break;
    if (item.work) runQueued(item);
    // (a caller's inline collective never overlaps pending requests: they block inline runs;
    // a caller's inline post may, which MPI_THREAD_MULTIPLE allows)
    if (pendingCount_.load() != 0 && callersWaiting_.load() == 0) {
      progressPending(/*blocking=*/true);
    }
  }
}

bool Engine::waitForWork(Queued& item) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] { return stop_ || (!queue_.empty() && !inlineBusy_); };
  const auto idle = std::chrono::steady_clock::now() -
                    std::chrono::steady_clock::time_point(
                        std::chrono::steady_clock::duration(lastProgress_.load()));
  if (pendingCount_.load() == 0 && idle >= kSlowAfter) {
    deepSleep_ = true;  // requests posted by callers now must wake it (addPending)
    cv_.wait(lock, [&] { return ready() || pendingCount_.load() != 0; });
    deepSleep_ = false;
  } else if (pendingCount_.load() == 0 || callersWaiting_.load() > 0) {
    // Point-to-point traffic lately, or a caller testing its own requests: stay ready
    // without being woken for every post (each wake-up is a context switch).
    cv_.wait_for(lock, kSlowPollInterval, ready);
  } else {
    cv_.wait_for(lock, idle < kSlowAfter ? kPollInterval : kSlowPollInterval, ready);
  }
  if (stop_) return false;
  if (!queue_.empty() && !inlineBusy_) {
    item = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    current_ = item.work;
  }
  return true;
}

void Engine::runQueued(Queued& item) {
  item.work->markStarted();
  bool done = false;
  std::exception_ptr error;
  try {
    mpi::SerialGuard inMpi;  // (serialized: beside the store's calls, mpi/Wait.hpp)
    done = item.task();
  } catch (...) {
    error = std::current_exception();
  }
  {
    // Not running before the Work completes: the caller it wakes may issue its next
    // blocking op at once, and must find the engine idle to run it inline.
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
    current_.reset();
    idleCv_.notify_all();
  }
  if (error) {
    item.work->markFailed(withOpContext(*item.work, error));
  } else if (done) {
    item.work->markCompleted();
  }
}

struct Engine::Finished {
  Pending pending;
  int rc;
  std::vector<MPI_Status> statuses;
};

void Engine::progressPending(bool blocking) {
  std::vector<Finished> finished;
  std::vector<Pending> aborted;  // by abortGroup()
  std::vector<std::pair<Pending, std::exception_ptr>> failedToPost;
  {
    mpi::SerialGuard inMpi;  // before progressMutex_, as a task that adds requests takes them
    std::unique_lock<std::mutex> lock(progressMutex_, std::defer_lock);
    if (blocking) {
      lock.lock();
    } else if (!lock.try_lock()) {
      return;
    }
    cancelMarkedPending(aborted);
    postHeldReceives(failedToPost);
    for (size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      if (p.held) {  // not matched yet: nothing posted to test
        ++i;
        continue;
      }
      bool done = false;
      const int rc = mpi::testEach(p.requests, p.statuses, done);
      if (rc != MPI_SUCCESS || done) {
        std::vector<MPI_Status> statuses = std::move(p.statuses);
        finished.push_back({std::move(p), rc, std::move(statuses)});
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (!finished.empty() || !failedToPost.empty()) {
      pendingCount_ = pending_.size();
      lastProgress_ = std::chrono::steady_clock::now().time_since_epoch().count();
    }
  }
  // Completion runs callbacks that may issue new ops (and so add pending requests): unlocked.
  for (auto& p : aborted) p.work->markFailed(failedWith(*p.work, p.abortedWhy));
  for (auto& [p, error] : failedToPost) failUnposted(p, error);
  for (auto& f : finished) completePending(f);
}

void Engine::completePending(Finished& f) {
  Pending& p = f.pending;
  try {
    if (f.rc != MPI_SUCCESS) {
      mpi::SerialGuard inMpi;  // it cancels the requests still active
      failPending(f);
    }
    if (p.then) p.then(f.statuses[0]);
    p.work->markCompleted();
  } catch (...) {
    p.work->markFailed(std::current_exception());
  }
}

void Engine::failPending(Finished& f) {
  Pending& p = f.pending;
  const int rc = f.rc;
  // the failed request's status (testEach marks it) names the peer where MPI filled it in
  const MPI_Status* failed = &f.statuses[0];
  for (const auto& st : f.statuses) {
    if (st.MPI_ERROR == rc) failed = &st;
  }
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  int errorClass = rc;
  MPI_Error_class(rc, &errorClass);
  // The requests still active are cancelled; the op's buffers are released (not copied back)
  // by its completion, told of the error through the status.
  if (mpi::cancelRequests(p.requests) && p.then) {
    MPI_Status told = f.statuses[0];
    told.MPI_ERROR = rc;
    p.then(told);
  }
  if (mpi::ft::isProcessFailure(rc))  // ULFM: the groups holding the failed rank are revoked
    MPIGPU_THROW_BACKEND(p.work->opName(), p.work->groupRank(), p.work->describe(),
                         ": a process of the job failed (", text, "); ",
                         mpi::ft::onProcessFailure(rc),
                         ". To go on, call torch.distributed.shrink_group(ranks_to_exclude=<the "
                         "failed ranks>, group=<the group>) on every survivor of that group");
  const bool peerKnown = failed->MPI_SOURCE >= 0 && failed->MPI_SOURCE != MPI_ANY_SOURCE;
  const std::string peer =
      peerKnown ? "rank " + std::to_string(failed->MPI_SOURCE) : std::string("the peer");
  if (errorClass == MPI_ERR_TRUNCATE) {
    MPIGPU_THROW_BACKEND(p.work->opName(), p.work->groupRank(), p.work->describe(),
                         ": the message from ", peer,
                         " is larger than this receive (its elements and dtype above), so MPI "
                         "truncated it (",
                         text,
                         "); the tensor's contents are undefined (MPI may have written the part "
                         "that fitted). A send and its receive must match in size and dtype");
  }
  MPIGPU_THROW_BACKEND(p.work->opName(), p.work->groupRank(), p.work->describe(), ": ", text,
                       peerKnown ? " (peer: " + peer + ")" : "",
                       " (a peer that failed, or a send and receive that do not match in size "
                       "and dtype)");
}

}  // namespace mpigpu
