// A communicator as the rest of mpigpu holds it, and the count of those mpigpu made: the bottom of
// mpi/, below the waits (mpi/Wait.hpp), the job (mpi/Env.hpp) and the calls (mpi/Collectives.hpp).
#pragma once

#include <mpi.h>

#include <cstdint>

namespace mpigpu::mpi {

struct Comm {
  MPI_Comm handle = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int64_t maxCount = 2147483647;  // elements per MPI call
  // Some member is crowded or below MPI_THREAD_MULTIPLE (mpi/Wait.hpp): its collectives begin
  // with arriveTogether. Agreed when the group is made (agreeArrival) and inherited by the
  // communicators made from it, so every member does the same.
  bool arrive = false;
  bool crowded = false;  // some member is crowded (algorithms choose by it)
};

// Communicators made by mpigpu and not yet freed (every one it makes is noted here and freed
// through freeComm): an MPI caps how many a process may hold (MPICH and the MPIs built on it:
// 2048), and the error for running out says how many are ours.
void noteMade(MPI_Comm comm);
int commsHeld();
void freeComm(MPI_Comm* comm);

}  // namespace mpigpu::mpi
