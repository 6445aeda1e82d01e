// Watches every collective in flight, on an engine thread or inline on a caller. One that runs
// past its timeout is reported on stderr (op, sequence number, group, bytes, how long it has run)
// and, by default, the job is ended with MPI_Abort: a blocked MPI call cannot be cancelled, and a
// job whose ranks disagree about what to run next only burns time
// (TORCH_MPIGPU_TIMEOUT_ACTION=abort|report).
//
// A rank that destroys a group, or whose interpreter exits (sys.exit on one rank, the end of its
// script) with groups not destroyed, says so through each group's store, with how many
// collectives it had issued there.
// A rank whose collective has waited a second for a rank that left before issuing it (or whose
// awaited send or receive is with a rank that left) reports that at once and ends the job the
// same way: the op can never finish, so waiting out the timeout (30 min by default) would only
// hide the cause.
// A rank whose launcher has gone (killed) ends itself at the next tick (LauncherWatch.hpp).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace mpigpu {

class Watchdog {
 public:
  struct Op {
    std::string group;
    const char* name = "";
    uint64_t seq = 0;  // the group's collective number (issue order, same on every rank)
    int rank = 0;
    int64_t bytes = 0;
    std::chrono::milliseconds timeout{0};
    bool onCaller = false;  // inline on the calling thread (Work.wait's timeout cannot help)
    bool abortOnTimeout = true;
    // A send or receive with this group rank (seq: this rank's point-to-point number): watched
    // only for the peer leaving the group (Work.wait() raises at its timeout), and only once
    // `awaited` (someone waits for it); -1: a collective.
    int peer = -1;
    std::shared_ptr<const std::atomic<bool>> awaited;
  };

  // Registers `op` as running from now; the returned guard ends the watch when it goes.
  class Scope {
   public:
    explicit Scope(Op op);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    uint64_t id_;
  };

  // A group's progress, published through its store about once a second (only when it changed),
  // so that a rank reporting a stuck collective can name the ranks that have not reached it.
  struct Progress {
    std::string group;
    int rank = 0, size = 1;
    c10::intrusive_ptr<c10d::Store> store;
    std::shared_ptr<std::atomic<uint64_t>> issued;  // collectives this rank has issued
  };
  static void addGroup(Progress p);
  // destroy_process_group: the group is left; the others learn it as at exit (below). Where this
  // process runs the group's TCPStore server (`hostsStore`: torch's env:// and tcp:// rendezvous
  // and ours start it on global rank 0), the store is held until every member has left, at most
  // until exit (releaseHeldStores), so their notices never meet a closed store.
  static void leaveGroup(const std::string& group, int rank, bool hostsStore);
  // abort() says nothing: it runs where something already failed, often with the store gone.
  static void removeGroup(const std::string& group, int rank);
  // The interpreter is exiting: every group still watched is left (after the engines drained).
  static void announceExit();

  // What the watchdog's thread also looks at each tick (~200 ms), for as long as it lives: work
  // queued on a device that no host thread watches, which must still give up at a timeout. (Its
  // one user, the barriers the GPU's streams waited for themselves, went with
  // NODE_DEVICE_ORDER=stream; only the tests register one now.)
  class Poller {
   public:
    virtual ~Poller() = default;
    virtual void poll() = 0;
  };
  static void addPoller(std::weak_ptr<Poller> poller);

  // Stops the watchdog thread (at exit, before MPI_Finalize).
  static void stop();
  // Lets go of the stores still held by leaveGroup (at exit, after MPI_Finalize: every rank has
  // left by then).
  static void releaseHeldStores();
};

}  // namespace mpigpu
