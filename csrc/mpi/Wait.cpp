#include "mpi/Wait.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include <sched.h>

#include "mpi/Check.hpp"
#include "mpi/Comm.hpp"

namespace mpigpu::mpi {
namespace {
std::atomic<bool> g_crowded{false};
std::atomic<uint64_t> g_sleepingWaits{0};
std::atomic<bool> g_serialized{false};
std::mutex g_mpiMutex;
thread_local int t_holds = 0;  // this thread's nested SerialGuards holding g_mpiMutex
}  // namespace

void setCrowded(bool crowded) { g_crowded = crowded; }

bool crowded() { return g_crowded.load(std::memory_order_relaxed); }

void setSerialized(bool serialized) { g_serialized = serialized; }

bool serialized() { return g_serialized.load(std::memory_order_relaxed); }

SerialGuard::SerialGuard() : held_(serialized()) {
  if (!held_) return;
  if (t_holds++ == 0) g_mpiMutex.lock();
}

SerialGuard::~SerialGuard() {
  if (held_ && --t_holds == 0) g_mpiMutex.unlock();
}

OutsideMpi::OutsideMpi() : depth_(t_holds) {
  if (depth_ == 0) return;
  t_holds = 0;
  g_mpiMutex.unlock();
}

OutsideMpi::~OutsideMpi() {
  if (depth_ == 0) return;
  g_mpiMutex.lock();
  t_holds = depth_;
}

uint64_t sleepingWaits() { return g_sleepingWaits.load(std::memory_order_relaxed); }

Backoff::Backoff(std::chrono::microseconds yieldFor, std::chrono::steady_clock::time_point start)
    : start_(start), yieldFor_(yieldFor), sleepUs_(kFirstSleepUs) {}

void Backoff::pause() {
  OutsideMpi outside;  // serialized: the store's server and callers run meanwhile
  if (std::chrono::steady_clock::now() - start_ < yieldFor_) {
    sched_yield();
    return;
  }
  slept_ = true;
  std::this_thread::sleep_for(std::chrono::microseconds(sleepUs_));
  sleepUs_ = std::min(2 * sleepUs_, kMaxSleepUs);
}

void wait(MPI_Request* request, const char* op, int rank) {
  // Serialized, a wait holding the MPI mutex inside MPI_Wait would keep this process's store
  // from answering the peer it waits for.
  if (!crowded() && !serialized()) {
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

bool agreeArrival(MPI_Comm comm, const char* op, int rank, bool* crowdedAnywhere) {
  const int mine = (crowded() ? 1 : 0) | (serialized() ? 2 : 0);
  int any = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPIGPU_MPI_CHECK(MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_BOR, comm, &request), op, rank);
  wait(&request, op, rank);
  if (crowdedAnywhere != nullptr) *crowdedAnywhere = (any & 1) != 0;
  return any != 0;
}

void arriveOn(MPI_Comm comm, const char* op, int rank) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPIGPU_MPI_CHECK(MPI_Ibarrier(comm, &request), op, rank);
  wait(&request, op, rank);
}

void arriveAmong(MPI_Comm comm, const std::vector<int>& members, int tag, const char* op,
                 int rank) {
  int me = 0;
  MPI_Comm_rank(comm, &me);
  const int first = members.front();
  std::vector<MPI_Request> requests;
  auto post = [&](bool send, int peer) {
    requests.push_back(MPI_REQUEST_NULL);
    char* none = nullptr;
    MPIGPU_MPI_CHECK(send ? MPI_Isend(none, 0, MPI_BYTE, peer, tag, comm, &requests.back())
                          : MPI_Irecv(none, 0, MPI_BYTE, peer, tag, comm, &requests.back()),
                     op, rank);
  };
  if (me != first) {
    post(true, first);
    post(false, first);  // answered once every member has sent
  } else {
    for (int m : members)
      if (m != first) post(false, m);
    for (auto& r : requests) wait(&r, op, rank);
    requests.clear();
    for (int m : members)
      if (m != first) post(true, m);
  }
  for (auto& r : requests) wait(&r, op, rank);
}

void arriveTogether(const Comm& comm, const char* op) {
  if (comm.arrive) arriveOn(comm.handle, op, comm.rank);
}

void barrierOn(const Comm& comm, const char* op, int rankForErrors) {
  const int rank = rankForErrors >= 0 ? rankForErrors : comm.rank;
  if (comm.arrive) return arriveOn(comm.handle, op, rank);
  MPIGPU_MPI_CHECK(MPI_Barrier(comm.handle), op, rank);
}

}  // namespace mpigpu::mpi
