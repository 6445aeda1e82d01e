// MPI process state: initialised once (MPI_THREAD_MULTIPLE requested), finalised once at exit and
// only if we initialised it; what the library is and what it can do (thread level, CUDA-awareness).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace mpigpu::mpi {

struct EnvInfo {
  std::string libraryVersion;  // MPI_Get_library_version, first line
  int standardMajor = 0, standardMinor = 0;
  int threadLevel = 0;  // what MPI granted
  bool initializedByUs = false;
  int worldRank = 0, worldSize = 1;
  int tagUpperBound = 32767;  // MPI_TAG_UB (the standard guarantees at least 32767)
  // Compile-time (mpi-ext.h) and run-time (MPIX_Query_cuda_support / MPIX_GPU_query_support)
  // answers; -1 = the library cannot tell.
  int cudaAwareCompileTime = -1;
  int cudaAwareRunTime = -1;
};

// Initialises MPI if nobody has (idempotent, thread-safe) and returns what it found.
const EnvInfo& ensureInitialized();
bool isFinalized();
// Finalises MPI if we initialised it; called once at interpreter exit after engines stopped.
void finalizeIfOwned();

std::string threadLevelName(int level);
// With less than MPI_THREAD_MULTIPLE every MPI call must come from one thread at a time:
// all process groups then share one engine thread (see engine/Engine.cpp).
bool needsSerializedAccess();

// Rendezvous help for launchers: rank 0's (host, port) to every rank of MPI_COMM_WORLD, and whether
// all ranks share one host. Runs before any process group exists.
struct Bootstrap {
  std::string host;
  int port = 0;
  bool singleHost = true;
  int worldRank = 0, worldSize = 1;
  // From the gathered host names: this rank's index among the ranks on its host, and their count
  // (a fallback for launchers that do not say).
  int localRank = 0, localSize = 1;
};
Bootstrap bootstrapAddress(const std::string& myHost, int myPort);

// Every rank's string, in world-rank order (any length). Collective over MPI_COMM_WORLD; the
// launcher's address agreement uses it before any process group exists.
std::vector<std::string> worldAllgather(const std::string& mine);

}  // namespace mpigpu::mpi
