// How a rank waits for other ranks inside MPI. Where every rank has a core, in MPI's own calls
// (MPI_Wait, blocking collectives): the lowest latency. Where ranks outnumber the cores (crowded,
// decided at import from TORCH_MPIGPU_MPI_YIELD), a rank waiting in a blocking MPI call spins a
// whole core, and the ranks it waits for get less of one: measured on the 2-core VM, 1.98 s of
// CPU in a 2 s MPI_Barrier under Open MPI 5 (mpi_yield_when_idle set) and under MPICH alike
// (docs/testing.md). There a wait tests for completion and sleeps in between.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>

namespace mpigpu::mpi {

struct Comm;

// Set once at import (launcher.py choose_mpi_yield); tests may flip it.
void setCrowded(bool crowded);
bool crowded();

// Completes `request` (MPI_Wait, or MPI_Test with sleeps when crowded). An MPI error names `op`
// and `rank`.
void wait(MPI_Request* request, const char* op, int rank);

// Whether any rank of `comm` is crowded, agreed over it (an MPI_Iallreduce completed by wait(),
// so it is also an arrival). Crowding is this host's (and this rank's binding's) alone: a job can
// hold a crowded host and one with a core per rank, and a collective that only some ranks
// begin with a barrier never matches (5 ranks on two 2-core hosts, 3 + 2, hung at start).
// Collective over `comm`.
bool agreeArrival(MPI_Comm comm, const char* op, int rank);
// Where comm.arrive: returns once every rank of `comm` has called it (MPI_Ibarrier completed by
// wait()), so that the blocking MPI call that follows finds its peers there instead of spinning
// while they compute, import or start. Nothing where no member is crowded. Collective over
// `comm`.
void arriveTogether(const Comm& comm, const char* op);
// MPI_Barrier, or (comm.arrive) arriveTogether. Not counted in callCount(). An error names
// `rankForErrors` (the group's rank where `comm` is a node's; -1: comm.rank).
void barrierOn(const Comm& comm, const char* op, int rankForErrors = -1);

// The pauses of one waiter between its checks (a crowded MPI wait, the node barrier): for the
// first `yieldFor`, sched_yield (a peer on this CPU runs at once); then sleeps growing from
// kFirstSleepUs to kMaxSleepUs (a peer far behind costs a wake-up every kMaxSleepUs, a few
// percent of a core).
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

// A crowded MPI wait yields for kYieldFor (a peer a step behind).
// Tried on 2026-12-03 and left (the 2-core VM, Open MPI 5, 3 ranks; benchmarks/crowded_waits.py
// and MPI's own collectives in 24-byte pieces, test_collectives_with_mpis_own_algorithm[3-env1]):
// - testing without a pause for 10 ms: MPICH's barrier at 3-4 ranks took 4-8 ms (its ranks never
//   yield, so a spinning rank keeps the core its peer needs);
// - sleeping 50 us at once: 4x in a barrier loop;
// - 1 us sleeps instead of yields (timer slack lowered to 1 us): a barrier loop 170-200 us
//   against 55-65 yielding; beside two idle-class busy loops (CI's background setups) the
//   collectives took 38-43 s against 20-23 s yielding and 11-13 s spinning; a sleep every 16th
//   yield: 21-23 s. The yield's price there (a yield can hand the core to the idle-class
//   process until the next tick) stays; on a quiet machine yielding and spinning take the same
//   (10 s).
// Which neighbours take a yield's core (2026-12-04, benchmarks/results/
// crowded_waits_background_load_2026-12-04.txt): idle-class or niced work of the job's own
// autogroup; not a neighbour of normal priority, beside which yielding is what keeps the job
// going (31.5 s against 78.9 spinning), nor niced work in an autogroup of its own.
constexpr std::chrono::microseconds kYieldFor{2000};
constexpr int kFirstSleepUs = 50;
constexpr int kMaxSleepUs = 500;

// Waits that slept at least once (tests count them to see the crowded path taken).
uint64_t sleepingWaits();

}  // namespace mpigpu::mpi
