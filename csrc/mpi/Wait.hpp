// How a rank waits for other ranks inside MPI. Where every rank has a core, in MPI's own calls
// (MPI_Wait, blocking collectives): the lowest latency. Where ranks outnumber the cores (crowded,
// decided at import from TORCH_MPIGPU_MPI_YIELD), a rank waiting in a blocking MPI call spins a
// whole core, and the ranks it waits for get less of one (a 2 s MPI_Barrier burns ~2 s of CPU
// under Open MPI 5, mpi_yield_when_idle set, and under MPICH alike). There a wait tests for
// completion and sleeps in between.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace mpigpu::mpi {

struct Comm;

// Set once at import (launcher.py choose_mpi_yield); tests may flip it.
void setCrowded(bool crowded);
bool crowded();

// Below MPI_THREAD_MULTIPLE (set as MPI starts, mpi/Env.cpp) any thread may call MPI, one at a
// time: the shared engine's (its ops), the MPI store's server and its callers. Each holds the
// process's MPI mutex while it calls MPI; one that waits on peers lets it go between its checks
// (Backoff::pause), so the store answers while the engine waits for a rank that first needs a
// store reply. The store's calls never block; the engine's blocking calls come after an arrival.
void setSerialized(bool serialized);
bool serialized();
// Holds the MPI mutex while it lives, where serialized() (a no-op otherwise); a thread may nest
// them.
class SerialGuard {
 public:
  SerialGuard();
  ~SerialGuard();
  SerialGuard(const SerialGuard&) = delete;
  SerialGuard& operator=(const SerialGuard&) = delete;

 private:
  bool held_;
};
// Lets go of this thread's hold on the MPI mutex (if any) while it lives: a pause between checks.
class OutsideMpi {
 public:
  OutsideMpi();
  ~OutsideMpi();
  OutsideMpi(const OutsideMpi&) = delete;
  OutsideMpi& operator=(const OutsideMpi&) = delete;

 private:
  int depth_;
};

// Completes `request` (MPI_Wait, or MPI_Test with pauses when crowded or serialized). An MPI
// error names `op` and `rank`.
void wait(MPI_Request* request, const char* op, int rank);

// Whether any rank of `comm` is crowded or serialized (then its collectives begin with
// arriveTogether), agreed over it (an MPI_Iallreduce completed by wait(), so it is also an
// arrival); `crowded`, if given: whether any rank is crowded. Crowding is this host's (and this
// rank's binding's) alone: a job can hold a crowded host and one with a core per rank, and a
// collective that only some ranks begin with a barrier never matches (5 ranks on two 2-core hosts,
// 3 + 2, hung at start). Collective over `comm`.
bool agreeArrival(MPI_Comm comm, const char* op, int rank, bool* crowded = nullptr);
// Where comm.arrive: returns once every rank of `comm` has called it (MPI_Ibarrier completed by
// wait()), so that the blocking MPI call that follows finds its peers there instead of spinning
// while they compute, import or start (serialized: or wait for a store reply from this process).
// Nothing where comm.arrive is unset. Collective over `comm`.
void arriveTogether(const Comm& comm, const char* op);
// Returns once every rank of `comm` has called it (MPI_Ibarrier completed by wait()). Collective.
void arriveOn(MPI_Comm comm, const char* op, int rank);
// Returns once every rank of `comm` in `members` (this one among them; the same list on each)
// has called it with `tag`: empty messages to members[0] and back, completed by wait(). Before
// a call collective over `members` alone (MPI_Comm_create_group), on a communicator of mpigpu's
// own (JobComm::arrivals), whose messages no program's receive takes.
void arriveAmong(MPI_Comm comm, const std::vector<int>& members, int tag, const char* op, int rank);
// MPI_Barrier, or (comm.arrive) arriveTogether. Not counted in callCount(). An error names
// `rankForErrors` (the group's rank where `comm` is a node's; -1: comm.rank).
void barrierOn(const Comm& comm, const char* op, int rankForErrors = -1);

// The pauses of one waiter between its checks (a crowded MPI wait, the node barrier): for the
// first `yieldFor`, sched_yield (a peer on this CPU runs at once); then sleeps growing from
// kFirstSleepUs to kMaxSleepUs (a peer far behind costs a wake-up every kMaxSleepUs, a few
// percent of a core). Serialized, the MPI mutex is let go during each pause.
class Backoff {
 public:
  // `start`: when the wait began (a caller that has read the clock already passes it)
  explicit Backoff(std::chrono::microseconds yieldFor,
                   std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now());
  void pause();
  bool slept() const { return slept_; }

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::microseconds yieldFor_;
  int sleepUs_;
  bool slept_ = false;
};

// A crowded MPI wait yields for kYieldFor (a peer a step behind), then sleeps, growing from
// kFirstSleepUs to kMaxSleepUs. Why not the alternatives (benchmarks/crowded_waits.py measures
// them; docs/performance.md): testing without a pause lets a spinning rank keep the core its peer
// needs (MPICH's ranks never yield); sleeping at once, or 1 us sleeps instead of yields, makes a
// barrier loop 3-4x slower. A yield can hand the core to idle-class or niced work of the job's own
// autogroup until the next tick (scripts/test.sh runs its background setups in an autogroup of
// their own for that reason); beside work of normal priority yielding is what keeps the job going.
constexpr std::chrono::microseconds kYieldFor{2000};
constexpr int kFirstSleepUs = 50;
constexpr int kMaxSleepUs = 500;

// Waits that slept at least once (tests count them to see the crowded path taken).
uint64_t sleepingWaits();

}  // namespace mpigpu::mpi
