#include "mpi/Wait.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include <sched.h>

#include "mpi/Check.hpp"
#include "mpi/Comm.hpp"

namespace mpigpu::mpi {
namespace {
std::atomic<bool> g_crowded{false};
std::atomic<uint64_t> g_sleepingWaits{0};
}  // namespace

void setCrowded(bool crowded) { g_crowded = crowded; }

bool crowded() { return g_crowded.load(std::memory_order_relaxed); }

uint64_t sleepingWaits() { return g_sleepingWaits.load(std::memory_order_relaxed); }

Backoff::Backoff(std::chrono::microseconds yieldFor, std::chrono::steady_clock::time_point start)
    : start_(start), yieldFor_(yieldFor), sleepUs_(kFirstSleepUs) {}

void Backoff::pause() {
  if (std::chrono::steady_clock::now() - start_ < yieldFor_) {
    sched_yield();
    return;
  }
  slept_ = true;
  std::this_thread::sleep_for(std::chrono::microseconds(sleepUs_));
  sleepUs_ = std::min(2 * sleepUs_, kMaxSleepUs);
}

void wait(MPI_Request* request, const char* op, int rank) {
  if (!crowded()) {
    MPIGPU_MPI_CHECK(MPI_Wait(request, MPI_STATUS_IGNORE), op, rank);
    return;
  }
  int done = 0;
  MPIGPU_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE), op, rank);
  if (done) return;
  // No second thread of ours polls beside this one (#25): callers of wait() sleep on the op
  // when crowded (Engine::callerSpin).
  Backoff backoff(kYieldFor);
  while (!done) {
    backoff.pause();
    MPIGPU_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE), op, rank);
  }
  if (backoff.slept()) g_sleepingWaits.fetch_add(1, std::memory_order_relaxed);
}

bool agreeArrival(MPI_Comm comm, const char* op, int rank) {
  const int mine = crowded() ? 1 : 0;
  int any = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPIGPU_MPI_CHECK(MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm, &request), op, rank);
  wait(&request, op, rank);
  return any != 0;
}

namespace {
void ibarrier(MPI_Comm comm, const char* op, int rank) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPIGPU_MPI_CHECK(MPI_Ibarrier(comm, &request), op, rank);
  wait(&request, op, rank);
}
}  // namespace

void arriveTogether(const Comm& comm, const char* op) {
  if (comm.arrive) ibarrier(comm.handle, op, comm.rank);
}

void barrierOn(const Comm& comm, const char* op, int rankForErrors) {
  const int rank = rankForErrors >= 0 ? rankForErrors : comm.rank;
  if (comm.arrive) return ibarrier(comm.handle, op, rank);
  MPIGPU_MPI_CHECK(MPI_Barrier(comm.handle), op, rank);
}

}  // namespace mpigpu::mpi
