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

// When crowded: returns once every rank of `comm` has called it (MPI_Ibarrier completed by
// wait()), so that the blocking MPI call that follows finds its peers there instead of spinning
// while they compute, import or start. Nothing where cores suffice. Collective over `comm`.
void arriveTogether(MPI_Comm comm, const char* op, int rank);
void arriveTogether(const Comm& comm, const char* op);
// MPI_Barrier, or (crowded) arriveTogether. Not counted in callCount().
void barrierOn(MPI_Comm comm, const char* op, int rank);

// A crowded wait tests and yields for kYieldFor (a peer a step behind), then sleeps between
// tests, from kFirstSleepUs growing to kMaxSleepUs (a peer far behind costs a wake-up every
// kMaxSleepUs, a few percent of a core).
// Tried on 2026-12-03 and left: testing without a pause instead of yielding (for 10 ms) made
// MPICH's barrier at 3-4 ranks on 2 cores 4-8 ms (its ranks never yield, so a spinning rank keeps
// the core its peer needs); sleeping at once cost 4x in a barrier loop. The yield has a price
// beside processes of the idle class (CI's background builds): a yield can hand them the core
// until the next tick, and MPI's own collectives at 3 ranks in 24-byte pieces took 20 s there
// against 7 s spinning (5 s either way on a quiet machine).
constexpr std::chrono::microseconds kYieldFor{2000};
constexpr int kFirstSleepUs = 50;
constexpr int kMaxSleepUs = 500;

// Waits that slept at least once (tests count them to see the crowded path taken).
uint64_t sleepingWaits();

}  // namespace mpigpu::mpi
