#include "mpi/FaultTolerance.hpp"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "mpi/Check.hpp"
#include "mpi/Comm.hpp"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

// Open MPI 5 declares the ULFM calls in mpi-ext.h (its ftmpi extension), MPICH in mpi.h; Open
// MPI 4.1 and MPIs without them build the stubs below.
#if defined(MPIX_ERR_PROC_FAILED) && defined(MPIX_ERR_REVOKED)
#define MPIGPU_HAVE_ULFM 1
#else
#define MPIGPU_HAVE_ULFM 0
#endif

namespace mpigpu::mpi::ft {
namespace {

struct FtState {
  bool active = false;
  std::string why;
};

// One MPI_T control variable's value as an integer; false where the library has none by `name`.
bool ftReadCvar(const char* name, long long* value) {
  int index = -1;
  if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS) return false;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int verbosity = 0, bind = 0, scope = 0, nameLen = 0, descLen = 0;
  MPI_T_enum enumtype{};
  if (MPI_T_cvar_get_info(index, nullptr, &nameLen, &verbosity, &type, &enumtype, nullptr, &descLen,
                          &bind, &scope) != MPI_SUCCESS)
    return false;
  MPI_T_cvar_handle handle{};
  int count = 0;
  if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) != MPI_SUCCESS) return false;
  alignas(8) unsigned char buf[64] = {0};
  bool ok = false;
  if (count == 1 && MPI_T_cvar_read(handle, buf) == MPI_SUCCESS) {
    ok = true;
    if (type == MPI_INT || type == MPI_UNSIGNED) {
      int v = 0;
      std::memcpy(&v, buf, sizeof v);
      *value = v;
    } else if (type == MPI_LONG_LONG || type == MPI_UNSIGNED_LONG_LONG || type == MPI_LONG ||
               type == MPI_UNSIGNED_LONG) {
      std::memcpy(value, buf, sizeof *value);
    } else if (type == MPI_C_BOOL || type == MPI_CHAR) {
      *value = buf[0];
    } else {
      ok = false;
    }
  }
  MPI_T_cvar_handle_free(&handle);
  return ok;
}

FtState ftDetect() {
  FtState s;
#if !MPIGPU_HAVE_ULFM
  s.why = "off: this MPI has no ULFM interface (MPIX_Comm_shrink); a dead rank ends the job";
  return s;
#else
  // name in MPI_T, environment variable that sets it, what turns it on
  struct Source {
    const char* cvar;
    const char* env;
    const char* how;
  };
  const Source sources[] = {
      {"mpi_ft_enable", "OMPI_MCA_mpi_ft_enable",
       "Open MPI's mpi_ft_enable (mpirun --with-ft ulfm)"},
      {"MPIR_CVAR_ENABLE_FT", "MPIR_CVAR_ENABLE_FT", "MPICH's MPIR_CVAR_ENABLE_FT"},
  };
  int provided = 0;
  const bool tools = MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS;
  for (const auto& src : sources) {
    long long v = 0;
    bool known = tools && ftReadCvar(src.cvar, &v);
    if (!known) {
      const char* e = std::getenv(src.env);
      if (e == nullptr) continue;
      known = true;
      v = (std::strcmp(e, "1") == 0 || std::strcmp(e, "true") == 0 || std::strcmp(e, "yes") == 0)
              ? 1
              : 0;
    }
    s.active = v != 0;
    s.why = c10::str(s.active ? "on" : "off", ": ", src.how, " is ", s.active ? "set" : "unset",
                     s.active ? "; a dead rank's groups fail on the survivors, who may shrink them"
                              : "; a dead rank ends the job");
    break;
  }
  if (tools) MPI_T_finalize();
  if (s.why.empty())
    s.why =
        "off: the MPI has the ULFM interface but says nothing of it being on; a dead rank "
        "ends the job";
  return s;
#endif
}

const FtState& ftState() {
  static const FtState s = ftDetect();
  return s;
}

struct FtGroup {
  std::string name;
  MPI_Comm comm, algoComm;
  std::function<void()> abandon;
  bool revoked = false;  // by pollFailures (once is enough)
};
std::mutex g_ftMutex;
std::map<const void*, FtGroup> g_ftGroups;

// A group holding a failed rank: revoked (its ops fail on every survivor), waits outside MPI
// ended. Under g_ftMutex.
void giveUpGroup(FtGroup& g) {
  g.revoked = true;
  revoke(g.comm);
  revoke(g.algoComm);
  if (g.abandon) g.abandon();
}

std::string ftRankList(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += c10::str(out.empty() ? "" : ", ", r);
  return out;
}

}  // namespace

bool compiled() { return MPIGPU_HAVE_ULFM != 0; }
bool active() { return ftState().active; }
std::string describe() { return ftState().why; }

bool isProcessFailure(int code) {
#if MPIGPU_HAVE_ULFM
  if (!active()) return false;
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING ||
         cls == MPIX_ERR_REVOKED;
#else
  (void)code;
  return false;
#endif
}

std::vector<int> failedRanks(MPI_Comm comm) {
  std::vector<int> out;
#if MPIGPU_HAVE_ULFM
  if (!active() || comm == MPI_COMM_NULL) return out;
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
#if defined(OMPI_HAVE_MPIX_COMM_GET_FAILED) || defined(MPICH)
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return out;
#else
  if (MPIX_Comm_failure_ack(comm) != MPI_SUCCESS ||
      MPIX_Comm_failure_get_acked(comm, &failed) != MPI_SUCCESS)
    return out;
#endif
  int n = 0;
  MPI_Group_size(failed, &n);
  if (n > 0 && MPI_Comm_group(comm, &all) == MPI_SUCCESS) {
    std::vector<int> in(n), mapped(n, MPI_UNDEFINED);
    for (int i = 0; i < n; ++i) in[i] = i;
    MPI_Group_translate_ranks(failed, n, in.data(), all, mapped.data());
    for (int r : mapped)
      if (r != MPI_UNDEFINED) out.push_back(r);
    MPI_Group_free(&all);
  }
  if (failed != MPI_GROUP_NULL && failed != MPI_GROUP_EMPTY) MPI_Group_free(&failed);
  std::sort(out.begin(), out.end());
#else
  (void)comm;
#endif
  return out;
}

void revoke(MPI_Comm comm) {
#if MPIGPU_HAVE_ULFM
  if (active() && comm != MPI_COMM_NULL) (void)MPIX_Comm_revoke(comm);
#else
  (void)comm;
#endif
}

bool isRevoked(MPI_Comm comm) {
#if MPIGPU_HAVE_ULFM && defined(OPEN_MPI)
  int flag = 0;
  if (active() && comm != MPI_COMM_NULL) (void)MPIX_Comm_is_revoked(comm, &flag);
  return flag != 0;
#else
  (void)comm;
  return false;
#endif
}

void acknowledge(MPI_Comm comm) {
#if MPIGPU_HAVE_ULFM
  if (active() && comm != MPI_COMM_NULL) (void)MPIX_Comm_failure_ack(comm);
#else
  (void)comm;
#endif
}

MPI_Comm shrink(MPI_Comm comm, const char* op, int rank) {
  MPI_Comm out = MPI_COMM_NULL;
#if MPIGPU_HAVE_ULFM
  MPIGPU_MPI_CHECK(MPIX_Comm_shrink(comm, &out), op, rank);
  noteMade(out);
  MPIGPU_MPI_CHECK(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN), op, rank);
#else
  (void)comm;
  (void)op;
  (void)rank;
#endif
  return out;
}

void addGroup(const void* key, const std::string& name, MPI_Comm comm, MPI_Comm algoComm,
              std::function<void()> abandon) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(g_ftMutex);
  g_ftGroups[key] = FtGroup{name, comm, algoComm, std::move(abandon)};
}

void removeGroup(const void* key) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(g_ftMutex);
  g_ftGroups.erase(key);
}

std::vector<int> failedRanksOf(const void* key) {
  if (!active()) return {};
  std::lock_guard<std::mutex> lock(g_ftMutex);
  const auto it = g_ftGroups.find(key);
  return it == g_ftGroups.end() ? std::vector<int>{} : failedRanks(it->second.comm);
}

bool anyGroupFailed() {
  if (!active()) return false;
  std::lock_guard<std::mutex> lock(g_ftMutex);
  return std::any_of(g_ftGroups.begin(), g_ftGroups.end(),
                     [](const auto& g) { return !failedRanks(g.second.comm).empty(); });
}

void pollFailures() {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(g_ftMutex);
  for (auto& [key, g] : g_ftGroups)
    if (!g.revoked && !failedRanks(g.comm).empty()) giveUpGroup(g);
}

std::string onProcessFailure(int code) {
  (void)code;
  // A peer's revoke can arrive before this process hears of the failure itself
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::string found;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(g_ftMutex);
      for (auto& [key, g] : g_ftGroups) {
        const std::vector<int> dead = failedRanks(g.comm);
        if (dead.empty()) continue;
        giveUpGroup(g);
        found += c10::str(found.empty() ? "" : "; ", "group '", g.name, "': rank",
                          dead.size() > 1 ? "s " : " ", ftRankList(dead));
      }
    }
    if (!found.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (found.empty())
    return "a peer revoked this group after a process failure; which rank failed is not known "
           "here yet";
  return c10::str("failed: ", found);
}

}  // namespace mpigpu::mpi::ft
