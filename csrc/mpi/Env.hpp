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
// Ends the whole job: MPI_Abort(MPI_COMM_WORLD, code) when MPI is running, else _exit(code).
// The standard promises MPI_Abort only a "best attempt"; Open MPI's PMIx_Abort has deadlocked
// before (open-mpi/ompi#3225, several ranks aborting at once: ompi-release#101). So a backstop
// thread exits this process after kAbortGraceSeconds if it is still here; the launcher then sees
// a rank die and ends the job. (Open MPI 5 across two hosts can leave its launcher running after
// every rank has gone through the watchdogs' MPI_Abort; a plain mpi4py program does the same:
// docs/troubleshooting.md.)
constexpr int kAbortGraceSeconds = 10;
// Before MPI_Abort, at most this long for the launcher to read what this process wrote to its
// stdout and stderr pipes (see waitUntilOutputIsRead in Env.cpp).
constexpr int kAbortOutputWaitMs = 2000;
[[noreturn]] void abortJob(int code);

std::string threadLevelName(int level);
// With less than MPI_THREAD_MULTIPLE every MPI call must come from one thread at a time:
// all process groups then share one engine thread (see engine/Engine.cpp).
bool needsSerializedAccess();

// The job communicator: torch's global ranks are its ranks. MPI_COMM_WORLD, unless the default
// group was made over a program's own communicator (torch_mpi_gpu.init_process_group(comm=...)):
// then a duplicate of that one, so our traffic never matches the program's.
struct JobComm {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  // Below MPI_THREAD_MULTIPLE: a duplicate of `comm` for the arrivals before a members-only
  // creation (mpi::arriveAmong), whose messages no program's receive may take.
  MPI_Comm arrivals = MPI_COMM_NULL;
};
JobComm jobComm();
// Collective over `comm` (MPI_COMM_WORLD when null): makes a duplicate of it the job
// communicator. Earlier duplicates stay until MPI_Finalize (freeing is collective over a job that
// may have ended elsewhere).
void useJobComm(MPI_Comm comm);
// A program's communicator from its Fortran handle (MPI_Comm_c2f, mpi4py's py2f(): portable
// between MPI libraries). MPI_COMM_NULL (this rank is not a member) and intercommunicators are
// errors naming `op` and this process's MPI_COMM_WORLD rank.
MPI_Comm userComm(int64_t fortranHandle, const char* op);
// The ranks, in the job communicator, of `comm`'s members in `comm`'s rank order; an error naming
// `op` when one of them is outside it.
std::vector<int> jobRanksOf(MPI_Comm comm, const char* op);

// Rendezvous help: rank 0's (host, port) to every rank of `comm`, and whether all ranks share one
// host. Runs before any process group exists.
struct Bootstrap {
  std::string host;
  int port = 0;
  bool singleHost = true;
  int rank = 0, size = 1;  // in `comm`
  // From the gathered host names: this rank's index among the ranks on its host, and their count
  // (a fallback for launchers that do not say).
  int localRank = 0, localSize = 1;
};
Bootstrap bootstrapAddress(const std::string& myHost, int myPort, MPI_Comm comm = MPI_COMM_WORLD);

// Every rank's string, in rank order of `comm` (any length). Collective over `comm`; the
// launcher's address agreement uses it before any process group exists.
std::vector<std::string> allgatherStrings(const std::string& mine, MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace mpigpu::mpi
