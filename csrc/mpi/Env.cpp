#include "mpi/Env.hpp"

#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

#include "core/Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Comm.hpp"
#include "mpi/FaultTolerance.hpp"
#include "mpi/Types.hpp"
#include "mpi/Wait.hpp"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

namespace mpigpu::mpi {
namespace {

std::mutex g_initMutex;
EnvInfo g_info;
bool g_ready = false;

int queryCudaAwareCompileTime() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return 1;
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  return 0;
#else
  return -1;
#endif
}

int queryCudaAwareRunTime() {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support();  // Open MPI
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int ok = 0;  // MPICH >= 4
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &ok) == MPI_SUCCESS) return ok ? 1 : 0;
  return -1;
#else
  return -1;
#endif
}

}  // namespace

void throwMpiError(int code, const char* call, const char* op, int rank, const char* file,
                   int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof(text), "MPI error code %d", code);
  }
  if (ft::isProcessFailure(code) || ft::anyGroupFailed()) {
    // ULFM: the groups holding the failed process are revoked on every survivor (so peers
    // blocked in their other ops wake too); groups without it go on
    MPIGPU_THROW_BACKEND(op, rank, "a process of the job failed (", text, ", from ", call, " at ",
                         file, ":", line, "); ", ft::onProcessFailure(code),
                         ". This op did not complete: its output tensors may hold partial "
                         "results. Every group holding a failed rank is revoked (its ops fail "
                         "on every survivor); groups without one keep working. To go on, call "
                         "torch.distributed.shrink_group(ranks_to_exclude=<the failed ranks>, "
                         "group=<the group>) on every survivor of that group (the default group "
                         "too: group=None)");
  }
  const std::string_view called(call);
  if (called.rfind("MPI_Comm_split", 0) == 0 || called.rfind("MPI_Comm_dup", 0) == 0 ||
      called.rfind("MPI_Comm_create", 0) == 0) {
    // Making a communicator fails above all where the process holds as many as its MPI allows.
    MPIGPU_THROW_BACKEND(
        op, rank, call, " failed: ", text, " (", file, ":", line,
        "). If MPI ran out of communicators: an MPI caps how many a process may hold (MPICH and "
        "the MPIs built on it: 2048, the program's own included), this process holds ",
        commsHeld(),
        " made by mpigpu, and each group holds 2 (3 or 4 where it spans nodes); destroy the "
        "groups you no longer need (dist.destroy_process_group(group)) or make fewer. Other "
        "ranks may be stuck in this op; check their logs.");
  }
  MPIGPU_THROW_BACKEND(op, rank, call, " failed: ", text, " (", file, ":", line,
                       "). Other ranks may be stuck in this op; check their logs. "
                       "The job should be restarted.");
}

const EnvInfo& ensureInitialized() {
  std::lock_guard<std::mutex> lock(g_initMutex);
  if (g_ready) return g_info;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    C10_THROW_ERROR(DistBackendError,
                    "mpigpu: MPI has already been finalized in this process; "
                    "create process groups before MPI_Finalize (e.g. before mpi4py finalizes)");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      C10_THROW_ERROR(DistBackendError, c10::str("mpigpu: MPI_Init_thread failed with code ", rc,
                                                 "; is this process started by mpirun/srun?"));
    }
    g_info.initializedByUs = true;
  }
  MPI_Query_thread(&g_info.threadLevel);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_info.worldRank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_info.worldSize);
  MPI_Get_version(&g_info.standardMajor, &g_info.standardMinor);
  int* tagUb = nullptr;
  int hasTagUb = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tagUb, &hasTagUb) == MPI_SUCCESS && hasTagUb) {
    g_info.tagUpperBound = *tagUb;
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string v(version, strnlen(version, sizeof(version)));
  g_info.libraryVersion = v.substr(0, v.find_first_of("\r\n"));
  while (!g_info.libraryVersion.empty() && g_info.libraryVersion.back() == ',') {
    g_info.libraryVersion.pop_back();
  }
  g_info.cudaAwareCompileTime = queryCudaAwareCompileTime();
  g_info.cudaAwareRunTime = queryCudaAwareRunTime();
  if (g_info.threadLevel < MPI_THREAD_SERIALIZED) {
    C10_THROW_ERROR(
        DistBackendError,
        c10::str("mpigpu: MPI was initialised with thread level ",
                 threadLevelName(g_info.threadLevel),
                 " but mpigpu calls MPI from a worker thread and needs at least "
                 "MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE preferred). Initialise "
                 "MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE), e.g. leave "
                 "mpi4py.rc.thread_level at 'multiple', or import torch_mpi_gpu first."));
  }
  setSerialized(g_info.threadLevel < MPI_THREAD_MULTIPLE);
  registerCustomTypes();
  // ULFM: a communicator made from MPI_COMM_WORLD after a failure must return the error, not
  // abort every survivor (MPI_Comm_create_group on a communicator with a failed process fails)
  if (ft::active()) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_ready = true;
  return g_info;
}

bool isFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

void finalizeIfOwned() {
  std::lock_guard<std::mutex> lock(g_initMutex);
  if (!g_ready || !g_info.initializedByUs || isFinalized()) return;
  releaseCustomTypes();
  MPI_Finalize();
}

namespace {
// A launcher forwards each rank's stdout and stderr through pipes, and MPI_Abort makes it end
// every rank and itself: what this process wrote that it has not read yet is lost. Under load,
// MPICH's Hydra loses a rank's last lines so, the reason for the abort among them. So wait, a
// bounded time, until the reader has taken what is in the pipes (on a
// pipe FIONREAD counts the unread bytes from either end; files and terminals need no wait).
void waitUntilOutputIsRead(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) continue;
    int unread = 0;
    while (ioctl(fd, FIONREAD, &unread) == 0 && unread > 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}
}  // namespace

void abortJob(int code) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  const bool running = initialized && !isFinalized();
  if (!running) std::_Exit(code);
  waitUntilOutputIsRead(std::chrono::milliseconds(kAbortOutputWaitMs));
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::thread([code, rank] {
    pthread_setname_np(pthread_self(), "mpigpu-abort");
    std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
    // no MPI, logging or stdio lock here: MPI_Abort may be stuck holding any of them
    char line[200];
    const int n = std::snprintf(line, sizeof line,
                                "mpigpu [rank %d]: MPI_Abort did not end this process within %d s; "
                                "exiting with code %d so that the launcher ends the job\n",
                                rank, kAbortGraceSeconds, code);
    if (n > 0) (void)!write(STDERR_FILENO, line, std::min<size_t>(n, sizeof line - 1));
    std::_Exit(code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort returned: the standard does not forbid it
}

std::string threadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return c10::str("unknown(", level, ")");
  }
}

bool needsSerializedAccess() { return ensureInitialized().threadLevel < MPI_THREAD_MULTIPLE; }

namespace {
// Rank and size are kept with it: a group's constructor reads them on the caller's thread, where
// no MPI call may run beside the engine's below MPI_THREAD_MULTIPLE.
std::mutex g_jobMutex;
std::optional<JobComm> g_job;  // unset: MPI_COMM_WORLD
}  // namespace

JobComm jobComm() {
  const auto& env = ensureInitialized();
  std::lock_guard<std::mutex> lock(g_jobMutex);
  return g_job ? *g_job : JobComm{MPI_COMM_WORLD, env.worldRank, env.worldSize};
}

namespace {
MPI_Comm duplicate(MPI_Comm comm, int rank) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPIGPU_MPI_CHECK(MPI_Comm_dup(comm, &dup), "init_process_group", rank);
  noteMade(dup);
  MPIGPU_MPI_CHECK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), "init_process_group", rank);
  return dup;
}
}  // namespace

void useJobComm(MPI_Comm comm) {
  const auto& env = ensureInitialized();
  std::optional<JobComm> next;
  const bool own = comm != MPI_COMM_NULL && comm != MPI_COMM_WORLD;
  if (own || serialized()) {
    next.emplace();
    const MPI_Comm from = own ? comm : MPI_COMM_WORLD;
    // serialized: the blocking dups start once every rank is here (mpi/Wait.hpp)
    if (serialized()) arriveOn(from, "init_process_group", env.worldRank);
    next->comm = own ? duplicate(from, env.worldRank) : MPI_COMM_WORLD;
    if (serialized()) next->arrivals = duplicate(from, env.worldRank);
    MPI_Comm_rank(next->comm, &next->rank);
    MPI_Comm_size(next->comm, &next->size);
  }
  std::lock_guard<std::mutex> lock(g_jobMutex);
  g_job = next;
}

MPI_Comm userComm(int64_t fortranHandle, const char* op) {
  const auto& env = ensureInitialized();
  MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(fortranHandle));
  if (comm == MPI_COMM_NULL) {
    C10_THROW_ERROR(ValueError,
                    c10::str("mpigpu ", op, " [world rank ", env.worldRank,
                             "]: comm is MPI_COMM_NULL: this rank is not a member of the "
                             "communicator (e.g. it passed MPI_UNDEFINED to MPI_Comm_split). Call ",
                             op, " only on the communicator's members."));
  }
  int inter = 0;
  MPIGPU_MPI_CHECK(MPI_Comm_test_inter(comm, &inter), op, env.worldRank);
  if (inter) {
    C10_THROW_ERROR(ValueError,
                    c10::str("mpigpu ", op, " [world rank ", env.worldRank,
                             "]: comm is an intercommunicator; a process group needs an "
                             "intracommunicator (MPI_Intercomm_merge makes one of it)."));
  }
  return comm;
}

std::vector<int> jobRanksOf(MPI_Comm comm, const char* op) {
  const auto& env = ensureInitialized();
  const JobComm job = jobComm();
  MPI_Group mine = MPI_GROUP_NULL, jobGroup = MPI_GROUP_NULL;
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> ranks(size), translated(size, MPI_UNDEFINED);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  MPIGPU_MPI_CHECK(MPI_Comm_group(comm, &mine), op, env.worldRank);
  MPIGPU_MPI_CHECK(MPI_Comm_group(job.comm, &jobGroup), op, env.worldRank);
  int rc = MPI_Group_translate_ranks(mine, size, ranks.data(), jobGroup, translated.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&jobGroup);
  MPIGPU_MPI_CHECK(rc, op, env.worldRank);
  for (int r = 0; r < size; ++r) {
    if (translated[r] == MPI_UNDEFINED) {
      C10_THROW_ERROR(ValueError,
                      c10::str("mpigpu ", op, " [world rank ", env.worldRank, "]: rank ", r,
                               " of comm is not in the default process group (", job.size,
                               " ranks); a group's communicator must be made from the default "
                               "group's, e.g. by splitting it."));
    }
  }
  return translated;
}

Bootstrap bootstrapAddress(const std::string& myHost, int myPort, MPI_Comm comm) {
  const auto& env = ensureInitialized();
  constexpr int kHostLen = 256;
  const char* op = "bootstrap";
  Bootstrap b;
  MPI_Comm_rank(comm, &b.rank);
  MPI_Comm_size(comm, &b.size);
  std::vector<char> all(static_cast<size_t>(kHostLen) * b.size, 0);
  std::vector<char> mine(kHostLen, 0);
  std::strncpy(mine.data(), myHost.c_str(), kHostLen - 1);
  // the first rank here waits for the others to start (seconds, importing torch)
  agreeArrival(comm, op, env.worldRank);
  MPIGPU_MPI_CHECK(
      MPI_Allgather(mine.data(), kHostLen, MPI_CHAR, all.data(), kHostLen, MPI_CHAR, comm), op,
      env.worldRank);
  int port = myPort;
  MPIGPU_MPI_CHECK(MPI_Bcast(&port, 1, MPI_INT, 0, comm), op, env.worldRank);
  b.host = std::string(all.data());
  b.port = port;
  auto host = [&](int r) { return all.data() + static_cast<size_t>(r) * kHostLen; };
  b.localRank = 0;
  b.localSize = 0;
  for (int r = 0; r < b.size; ++r) {
    if (std::strncmp(host(0), host(r), kHostLen) != 0) b.singleHost = false;
    if (std::strncmp(host(b.rank), host(r), kHostLen) == 0) {
      ++b.localSize;
      if (r < b.rank) ++b.localRank;
    }
  }
  return b;
}

std::vector<std::string> allgatherStrings(const std::string& mine, MPI_Comm comm) {
  const auto& env = ensureInitialized();
  const char* op = "allgather_strings";
  int size = 1;
  MPI_Comm_size(comm, &size);
  int myLength = static_cast<int>(mine.size());
  std::vector<int> lengths(size), offsets(size, 0);
  agreeArrival(comm, op, env.worldRank);
  MPIGPU_MPI_CHECK(MPI_Allgather(&myLength, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm), op,
                   env.worldRank);
  for (int r = 1; r < size; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::vector<char> all(static_cast<size_t>(offsets.back() + lengths.back()) + 1);
  MPIGPU_MPI_CHECK(MPI_Allgatherv(mine.data(), myLength, MPI_CHAR, all.data(), lengths.data(),
                                  offsets.data(), MPI_CHAR, comm),
                   op, env.worldRank);
  std::vector<std::string> out;
  out.reserve(size);
  for (int r = 0; r < size; ++r) out.emplace_back(all.data() + offsets[r], lengths[r]);
  return out;
}

}  // namespace mpigpu::mpi
