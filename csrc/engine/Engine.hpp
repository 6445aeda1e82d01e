// The worker thread behind a process group: runs ops in issue order (MPI needs the same order on
// every rank) and progresses non-blocking point-to-point requests between them.
//
// Invariants:
// - Issue order: ops start in the order they were issued on this group, whichever thread runs
//   them. A task runs inline on the caller (tryInline) only when nothing is queued or running
//   ahead of it; while it runs (inlineBusy_) the worker starts nothing queued meanwhile.
// - Queued: everything else (async ops, ops on device tensors, ops issued while the engine is
//   busy) runs on the worker, one at a time, in queue order.
// - Point-to-point: the posting task (inline or on the worker) leaves its requests with
//   addPending; they complete in any order. The worker tests them between ops, and a caller
//   waiting on one of them tests too (assistProgress), one pass at a time (progressMutex_).
//   Completion (copy back, Work completed) happens on whichever thread saw the requests finish.
// - One engine per group, or one for all groups with less than MPI_THREAD_MULTIPLE (then only
//   its worker, or one inline caller at a time, runs ops, holding the MPI mutex that the MPI
//   store's calls take too, mpi/Wait.hpp; its waits let the mutex go between tests).
// - End: shutdown() joins the worker, then fails what is queued or pending; abort() fails it all
//   at once and leaves a worker blocked inside MPI behind (see abort()). abortGroup() on a shared
//   engine fails one group's ops and keeps serving the others, unless that group's op is the one
//   inside MPI. At interpreter exit shutdownAll() first drains the queues in issue order
//   (bounded), then stops every engine.
#pragma once

#include <mpi.h>

#include <c10/util/FunctionRef.h>

#include <condition_variable>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/WorkMPIGPU.hpp"

namespace mpigpu {

class Engine : public ProgressDriver {
 public:
  // Runs on the worker; returns true when the op is finished, false when it left requests with
  // addPending (point-to-point). A throw fails the Work with that exception.
  using Task = std::function<bool()>;
  // Runs on the worker once all requests of a pending op completed (e.g. copy a receive back).
  using Then = std::function<void(const MPI_Status&)>;

  // One engine per process group, or one shared by all when the MPI library grants less than
  // MPI_THREAD_MULTIPLE (then only one thread may be inside MPI at a time).
  static std::shared_ptr<Engine> create(const std::string& name);
  // Stops every engine (fails what is still queued); called at exit before MPI_Finalize.
  static void shutdownAll();

  Engine(std::string name, bool shared);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void submit(c10::intrusive_ptr<WorkMPIGPU> work, Task task);
  // Runs `task` on the calling thread instead of the worker when that keeps issue order, and
  // returns true; otherwise does nothing and returns false (then submit it).
  //   Inline::Collective: a finished-in-one-go task (a small blocking op), when nothing is
  //     queued, running or pending. No hand-off, no thread wake-ups on the critical path.
  //   Inline::Post: a point-to-point task that leaves requests with addPending, when nothing is
  //     queued or running ahead of it (pending requests are fine); never with
  //     MPI_THREAD_SERIALIZED, since the worker may be testing requests meanwhile.
  enum class Inline { Collective, Post };
  // (`task` is borrowed, not copied: an op that runs inline allocates no std::function.)
  bool tryInline(const c10::intrusive_ptr<WorkMPIGPU>& work, c10::function_ref<bool()> task,
                 Inline kind);
  // Tests the pending requests once from the calling thread, unless another thread is at it;
  // completes what finished. Lets Work::wait() see a reply without waiting for the worker.
  void assistProgress() override;
  void callerWaiting(bool waiting) override;
  std::chrono::microseconds callerSpin() const override;
  // Runs `task` on the worker and waits for it (communicator creation and release) up to
  // `timeout`; false when it did not finish by then (it stays queued: abort() drops it).
  // `peerFailed` (ULFM; not on a shared engine), asked about every 200 ms while the task runs:
  // non-empty (why) when a peer of the task has failed and MPI may never return (Open MPI 5's
  // MPI_Comm_create_group does not, revoked or not). Then this engine is aborted, its worker left
  // inside MPI (MPI_Finalize goes through beside it under ULFM), and a DistBackendError naming
  // `opName`, `rank` and why is thrown.
  bool runAndWait(const char* opName, const std::string& group, int rank,
                  std::function<void()> task,
                  std::chrono::milliseconds timeout = std::chrono::hours(24 * 365),
                  const std::function<std::string()>& peerFailed = nullptr);
  void addPending(std::vector<MPI_Request> requests, c10::intrusive_ptr<WorkMPIGPU> work,
                  Then then);
  // A receive MPI sees only once it can be matched (mpi/AnySource.hpp: probe): from any source,
  // a later progress pass finds its message with MPI_Improbe and calls post(&message); from a
  // named source, post(nullptr) runs at once unless a receive of the same comm and tag is still
  // held ahead of it. Its requests then complete as addPending's do.
  struct HeldReceive {
    MPI_Comm comm;
    int source;  // MPI_ANY_SOURCE, or a rank of comm
    int tag;
    std::function<std::vector<MPI_Request>(MPI_Message*)> post;
  };
  void addHeldReceive(HeldReceive receive, c10::intrusive_ptr<WorkMPIGPU> work, Then then);
  // Before `comm` is freed (destroy_process_group): its receives still held fail with `why` (a
  // later pass would probe a freed communicator; posted requests outlive it, as MPI allows).
  void failHeldReceives(MPI_Comm comm, const std::string& why);
  void shutdown();
  // c10d's abort(): stops without waiting for anything. Queued ops and pending point-to-point
  // requests fail with `why` (the requests are cancelled and freed first, so MPI never writes
  // into their buffers later). Returns false when the worker is inside a blocking MPI call, which
  // nothing can interrupt: it is then left running, and the engine must be kept alive.
  // `peerFailed`: the worker is left inside MPI because a peer failed under ULFM, where
  // MPI_Finalize still returns (not counted by anyStuckInMpi).
  bool abort(const std::string& why, bool peerFailed = false);
  // c10d's abort() for one group (`group`: its name, as its Works carry it). An engine of the
  // group's own is aborted whole. A shared engine is aborted whole only when that group's op is
  // the one inside MPI (on the worker or inline): no other thread may enter MPI while it is
  // blocked there, so the other groups' ops could never run; they fail, saying why. Otherwise
  // only the group's queued ops fail (at once) and its pending requests are cancelled and fail
  // (on the worker, which alone may call MPI), and the engine goes on serving the other groups.
  // Returns false when a thread is left inside MPI, as abort() does.
  bool abortGroup(const std::string& group, const std::string& why);
  bool stopped() const;
  // An aborted engine's worker still inside MPI: MPI cannot be finalised in this process.
  static bool anyStuckInMpi();
  // This engine's worker was left inside MPI by an abort (its thread detached).
  bool leftInsideMpi() const;
  bool onWorkerThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  struct Queued {
    c10::intrusive_ptr<WorkMPIGPU> work;
    Task task;
  };
  struct Pending {
    std::vector<MPI_Request> requests;
    c10::intrusive_ptr<WorkMPIGPU> work;
    Then then;
    std::string abortedWhy;  // set by abortGroup(): the worker cancels the requests, fails the op
    std::optional<HeldReceive> held;   // not yet posted: requests empty (addHeldReceive)
    std::vector<MPI_Status> statuses;  // one per request, filled as each completes (testEach)
  };
  // Why an outstanding op fails when the engine stops (abort() names the blocking op to others).
  using WhyFor = std::function<std::string(const WorkMPIGPU&)>;

  struct Finished;  // a pending request set that finished (or failed)

  void loop();
  // Waits for a queued op (taken into `item`, if one is ready) or a pending request to test;
  // false once the engine stops.
  bool waitForWork(Queued& item);
  void runQueued(Queued& item);
  // Lets what is queued run (in issue order, on the worker) and waits until the engine is idle
  // or `timeout` passed; false: still busy, `busy` then says with what.
  bool drain(std::chrono::milliseconds timeout, std::string* busy);
  bool endInline();  // clears inlineBusy_; true when ops were queued meanwhile
  // Tests every pending request set; completes the finished ones outside the lock. `blocking`:
  // wait for another thread's pass instead of skipping.
  void progressPending(bool blocking);
  void wakeToPoll();  // after a post: the worker must test it even if it sleeps for good
  // A held receive that never reached MPI: its buffers released, its op failed with `error`.
  static void failUnposted(Pending& p, std::exception_ptr error);
  // Posts the held receives that can be matched now, in the order they were added (under
  // progressMutex_); those whose posting failed go to `failed`.
  void postHeldReceives(std::vector<std::pair<Pending, std::exception_ptr>>& failed);
  void completePending(Finished& f);
  // A failed MPI_Testall: cancels what is still active, tells the op's completion, and throws
  // the error naming the op.
  [[noreturn]] void failPending(Finished& f);
  // Fails every queued op and pending request with `why` (after stop_ is set). `mayCallMpi`:
  // false while another thread is inside MPI and the MPI grants less than THREAD_MULTIPLE; then
  // requests are not cancelled but their buffers are kept until exit.
  void failOutstanding(const WhyFor& why, bool mayCallMpi = true);
  // runAndWait's wait where `peerFailed` is asked: false at `timeout`; throws where it answers.
  bool waitUnlessPeerFailed(WorkMPIGPU& work, std::chrono::milliseconds timeout, const char* opName,
                            int rank, const std::function<std::string()>& peerFailed);
  // abort() with a message per op (abortGroup() tells the other groups' ops what blocked them).
  bool abortAll(const WhyFor& why, const std::string& stopReason, bool peerFailed = false);
  // Cancels an abandoned op's requests; where that is not allowed (`mayCallMpi` false) or
  // fails, keeps its buffers until exit instead.
  static void cancelOrKeep(Pending& p, bool mayCallMpi);
  // Pending requests abortGroup() marked: cancels them (worker only) and moves them to `failed`.
  void cancelMarkedPending(std::vector<Pending>& failed);

  const std::string name_;
  const bool shared_;  // serves every group (MPI grants less than THREAD_MULTIPLE)
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idleCv_;  // the worker finished a task, an inline run ended, or stop
  std::deque<Queued> queue_;
  bool stop_ = false;
  bool running_ = false;                       // the worker is inside a task
  bool leftInside_ = false;                    // abortAll detached the worker inside a task
  c10::intrusive_ptr<WorkMPIGPU> current_;     // that task's Work (abort() fails it)
  c10::intrusive_ptr<WorkMPIGPU> inlineWork_;  // the op a caller runs inline (inlineBusy_)
  std::string stopReason_;                     // why ops submitted after the stop are refused
  bool inlineBusy_ = false;              // a caller is running a task inline; the worker must wait
  bool deepSleep_ = false;               // the worker waits for work with no time limit
  const bool serialized_;                // MPI_THREAD_SERIALIZED: MPI calls only on the worker
  std::atomic<size_t> pendingCount_{0};  // pending_.size(), readable without the lock
  std::atomic<int> callersWaiting_{0};   // callers inside assisted waits: the worker backs off
  // pending_ is tested by the worker and by waiting callers (assistProgress): one pass at a time
  // (two threads must not test the same request).
  std::mutex progressMutex_;
  std::vector<Pending> pending_;  // guarded by progressMutex_
  // Last post or completion (steady_clock ticks): the worker polls fast just after one.
  std::atomic<int64_t> lastProgress_{0};
  std::thread thread_;
};

}  // namespace mpigpu
