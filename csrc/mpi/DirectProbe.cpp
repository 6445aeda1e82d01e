#include "mpi/DirectProbe.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/StringUtil.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <mutex>
#include <vector>

#include "mpi/Check.hpp"
#include "mpi/Env.hpp"

namespace mpigpu::mpi {
namespace {

constexpr int64_t kEager = 16;       // int32 elements: an eager message in every library
constexpr int64_t kLarge = 1 << 18;  // 1 MiB: rendezvous (CUDA IPC, GPUDirect) everywhere
constexpr int64_t kGathered = 1024;  // per rank, through the library's collective path
constexpr int kTag = 0x6d70;         // on the group's own algorithm communicator

// Values no other rank or position shares; fits int32 for 1000 ranks and kLarge elements.
at::Tensor pattern(int rank, int64_t n, const at::Device& device) {
  auto opts = at::TensorOptions().dtype(at::kInt).device(device);
  return at::arange(n, opts).mul_(7).add_((rank % 1000) * 1000003 + 1);
}

// MPI must not read a buffer that a queued kernel still writes, nor we one MPI still fills.
void settle(const at::Device& device) {
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  impl.getStream(device).synchronize();
}

// "" when `got` holds `want`, else what differs.
std::string compare(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const at::Tensor host = got.cpu();
  if (at::equal(host, want)) return "";
  const int64_t bad = host.ne(want).sum().item<int64_t>();
  return c10::str(what, ": ", bad, " of ", want.numel(), " elements wrong");
}

// A crash inside MPI during the probe: the message first, then the previous handler (Python's
// faulthandler, or the default action) as if we had not been there.
char g_crashNote[768];
size_t g_crashNoteLen = 0;
struct sigaction g_previous[2];
constexpr int kSignals[2] = {SIGSEGV, SIGBUS};

void onCrash(int sig) {
  ssize_t ignored = write(STDERR_FILENO, g_crashNote, g_crashNoteLen);
  (void)ignored;
  for (int i = 0; i < 2; ++i)
    if (kSignals[i] == sig) sigaction(sig, &g_previous[i], nullptr);
  // returning re-runs the faulting access, which now reaches the previous handler
}

class CrashNote {
 public:
  explicit CrashNote(const std::string& note) {
    g_crashNoteLen = std::min(note.size(), sizeof(g_crashNote));
    std::memcpy(g_crashNote, note.data(), g_crashNoteLen);
    struct sigaction sa{};
    sa.sa_handler = &onCrash;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &sa, &g_previous[i]);
  }
  ~CrashNote() {
    for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
  }
  CrashNote(const CrashNote&) = delete;
  CrashNote& operator=(const CrashNote&) = delete;
};

// MPI's words for a failed call: a probe failure, not an exception (the peers still take part
// in the remaining exchanges and the agreement).
std::string failed(int rc, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return c10::str(call, " failed: ", std::string(text, len));
}

// This rank's checks: "" when every exchange brought the expected bytes, else the first that did
// not. Every rank makes every call, whatever it saw, so none is left waiting.
std::string exchange(const Comm& comm, const at::Device& device) {
  const int p = comm.size, r = comm.rank;
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  const at::Device cpu(at::kCPU);
  std::string wrong;
  auto note = [&](const std::string& w) {
    if (wrong.empty()) wrong = w;
  };
  for (int64_t n : {kEager, kLarge}) {
    const at::Tensor send = pattern(r, n, device);
    const at::Tensor recv = at::full({n}, -1, send.options());
    settle(device);
    const int rc = MPI_Sendrecv(send.data_ptr(), static_cast<int>(n), MPI_INT32_T, right, kTag,
                                recv.data_ptr(), static_cast<int>(n), MPI_INT32_T, left, kTag,
                                comm.handle, MPI_STATUS_IGNORE);
    settle(device);
    note(rc != MPI_SUCCESS ? failed(rc, "MPI_Sendrecv")
                           : compare(recv, pattern(left, n, cpu),
                                     c10::str(n * 4, "-byte send/recv from rank ", left)));
  }
  const at::Tensor mine = pattern(r, kGathered, device);
  const at::Tensor all = at::full({p * kGathered}, -1, mine.options());
  settle(device);
  const int rc =
      MPI_Allgather(mine.data_ptr(), static_cast<int>(kGathered), MPI_INT32_T, all.data_ptr(),
                    static_cast<int>(kGathered), MPI_INT32_T, comm.handle);
  settle(device);
  std::vector<at::Tensor> want;
  for (int q = 0; q < p; ++q) want.push_back(pattern(q, kGathered, cpu));
  note(rc != MPI_SUCCESS
           ? failed(rc, "MPI_Allgather")
           : compare(all, at::cat(want), c10::str(kGathered * 4, "-byte all-gather")));
  return wrong;
}

std::mutex g_statusMutex;
std::string g_status =
    "not run (it runs at the first group with a GPU where the MPI library reports CUDA support)";

}  // namespace

std::string cudaSupportFix(const std::string& library) {
  auto has = [&](const char* s) { return library.find(s) != std::string::npos; };
  if (has("CRAY MPICH") || has("Cray MPICH")) {
    return "Cray MPICH takes device pointers only with its GPU transport layer linked "
           "(libmpi_gtl_cuda: module load craype-accel-nvidia*) and MPICH_GPU_SUPPORT_ENABLED=1";
  }
  if (has("MVAPICH")) return "MVAPICH takes device pointers only with MV2_USE_CUDA=1";
  if (has("MPICH")) {
    return "MPICH takes device pointers only when built with CUDA (--with-cuda) and run with "
           "MPIR_CVAR_ENABLE_GPU=1";
  }
  if (has("Open MPI")) {
    return "Open MPI takes device pointers only when built with CUDA (--with-cuda, or UCX built "
           "with CUDA) and not run with its CUDA support off (opal_cuda_support=0, "
           "btl_smcuda_use_cuda_ipc=0 with a container that blocks CUDA IPC)";
  }
  return "check how your MPI library is built and run for CUDA support";
}

ProbeOutcome probeDirect(const Comm& comm, const at::Device& device, bool corrupt, const char* op) {
  const auto start = std::chrono::steady_clock::now();
  const std::string library = ensureInitialized().libraryVersion;
  std::string wrong;
  {
    CrashNote note(c10::str("\nmpigpu ", op, " [rank ", comm.rank,
                            "]: the MPI library crashed on a device buffer in mpigpu's "
                            "CUDA-awareness probe although it reports CUDA support. ",
                            cudaSupportFix(library),
                            "; or set TORCH_MPIGPU_CUDA_AWARE=0 to stage CUDA tensors through "
                            "host memory.\n"));
    wrong = exchange(comm, device);
  }
  if (corrupt && wrong.empty()) {
    wrong =
        "TORCH_MPIGPU_TEST_CUDA_PROBE_FAILS=1 (a test setting) failed this rank's check on purpose";
  }
  // the lowest rank that saw wrong bytes, or p: one agreement round
  int firstWrong = wrong.empty() ? comm.size : comm.rank;
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &firstWrong, 1, MPI_INT, MPI_MIN, comm.handle), op,
                   comm.rank);
  ProbeOutcome out;
  out.ok = firstWrong == comm.size;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (out.ok) {
    out.detail = c10::str("send/recv of ", kEager * 4, " and ", kLarge * 4, " bytes and a ",
                          kGathered * 4, "-byte all-gather per rank came back right on ", comm.size,
                          comm.size == 1 ? " rank" : " ranks");
  } else if (!wrong.empty()) {
    out.detail = c10::str("rank ", comm.rank, ": ", wrong);
  } else {
    out.detail = c10::str("rank ", firstWrong, " saw wrong bytes (its log says which)");
  }
  return out;
}

void recordProbe(const std::string& status) {
  std::lock_guard<std::mutex> lock(g_statusMutex);
  g_status = status;
}

std::string probeStatus() {
  std::lock_guard<std::mutex> lock(g_statusMutex);
  return g_status;
}

}  // namespace mpigpu::mpi
