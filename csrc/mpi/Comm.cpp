#include "mpi/Comm.hpp"

#include <atomic>

namespace mpigpu::mpi {

namespace {
std::atomic<int> g_commsHeld{0};
}  // namespace

void noteMade(MPI_Comm comm) {
  if (comm != MPI_COMM_NULL) g_commsHeld.fetch_add(1, std::memory_order_relaxed);
}

int commsHeld() { return g_commsHeld.load(std::memory_order_relaxed); }

void freeComm(MPI_Comm* comm) {
  if (*comm != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(comm);
    *comm = MPI_COMM_NULL;
    g_commsHeld.fetch_sub(1, std::memory_order_relaxed);
  }
}

}  // namespace mpigpu::mpi
