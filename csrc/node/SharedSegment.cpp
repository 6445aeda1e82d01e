#include "node/SharedSegment.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "core/Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/FaultTolerance.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu::node {

// 128 bytes: two cache lines, so the adjacent-line prefetcher does not couple two ranks' counters.
struct SharedSegment::Peer {
  uint64_t arrived;  // syncs this rank has reached (atomic access only)
  int64_t pid;
  uint64_t published;     // the address this rank's peers may read (publish; ordered by sync)
  uint64_t pidNamespace;  // its PID namespace (0: unknown): where `pid` means that process
  int32_t cpu;  // the CPU this rank ran on at its last arrival (atomic access only; -1: unknown)
  // nonzero once this rank left the group's ops after a process failure elsewhere (ULFM:
  // mpi/FaultTolerance.hpp), so that its peers stop waiting for it (atomic access only)
  uint32_t gaveUp;
  uint8_t pad[88];
};
static_assert(sizeof(SharedSegment::Peer) == 128, "one Peer per 128 bytes");

namespace {

constexpr size_t kPage = 4096;
// probeSingleCopy: each rank's token is this XOR its pid, so a read from the wrong place shows.
constexpr uint64_t kProbeMagic = 0x6d70696770752d31ULL;

// A spin-wait hint: the waiting thread leaves the core's resources to its sibling hyperthread,
// which may be the very peer it waits for.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string errnoText(int e) { return std::strerror(e); }

// This process's PID namespace (the inode of /proc/self/ns/pid); 0 where that cannot be read.
uint64_t pidNamespaceId() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Rank 0's part, once its segment exists: the file sized and its pages reserved. "" on success.
std::string sizeSegment(int fd, size_t bytes) {
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    return c10::str("ftruncate(", bytes, " bytes): ", errnoText(errno));
  // reserve the pages now: a tmpfs that cannot hold them says so here, not with SIGBUS later
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    return c10::str("reserving ", bytes, " bytes in /dev/shm: ", errnoText(rc),
                    " (make /dev/shm larger, e.g. docker --shm-size, or lower "
                    "TORCH_MPIGPU_NODE_BUFFER_BYTES)");
  }
  return "";
}

// A new segment under a name of our own on this node: rank 0's pid and a count within this
// process. A name can still be taken: a job killed while making its segment leaves it in
// /dev/shm, and a later rank 0 may get the same pid (CI met this). Then a random suffix, a few
// times over. "" on success.
std::string makeUniqueSegment(size_t bytes, char (&name)[64], int* fdOut) {
  static std::atomic<int> made{0};
  const long pid = static_cast<long>(getpid());
  const int count = made++;
  std::snprintf(name, sizeof name, "/mpigpu-%ld-%d", pid, count);
  std::random_device random;
  for (int attempt = 1;; ++attempt) {
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      *fdOut = fd;
      return sizeSegment(fd, bytes);
    }
    if (errno != EEXIST || attempt == 8)
      return c10::str("shm_open(", name, "): ", errnoText(errno));
    std::snprintf(name, sizeof name, "/mpigpu-%ld-%d-%08x", pid, count,
                  static_cast<unsigned>(random()));
  }
}

}  // namespace

std::unique_ptr<SharedSegment> SharedSegment::create(const mpi::Comm& nodeComm, int64_t slotBytes,
                                                     const char* op, int rankForErrors,
                                                     std::string* why) {
  std::unique_ptr<SharedSegment> seg(new SharedSegment());
  seg->localRank_ = nodeComm.rank;
  seg->localSize_ = nodeComm.size;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && nodeComm.size > cores) seg->spinLimit_ = 0;
  seg->slotBytes_ = static_cast<int64_t>(roundUp(static_cast<size_t>(slotBytes), kPage));
  seg->headerBytes_ = roundUp(sizeof(Peer) * nodeComm.size, kPage);
  const size_t bytes = seg->headerBytes_ + 2 * nodeComm.size * static_cast<size_t>(seg->slotBytes_);
  // Every rank of the node is here before a name exists: a rank that never comes (an op only
  // some ranks called, then abort, destroy or a kill) leaves nothing in /dev/shm.
  mpi::barrierOn(nodeComm, op, rankForErrors);
  char name[64] = {0};
  std::string error;
  int fd = -1;
  if (nodeComm.rank == 0) error = makeUniqueSegment(bytes, name, &fd);
  int made0 = error.empty() ? 1 : 0;
  MPIGPU_MPI_CHECK(MPI_Bcast(&made0, 1, MPI_INT, 0, nodeComm.handle), op, rankForErrors);
  MPIGPU_MPI_CHECK(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, nodeComm.handle), op, rankForErrors);
  if (nodeComm.rank != 0 && made0) {
    fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) error = c10::str("shm_open(", name, ") of rank 0's segment: ", errnoText(errno));
  }
  if (made0 && fd >= 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      error = c10::str("mmap(", bytes, " bytes): ", errnoText(errno));
    } else {
      seg->base_ = static_cast<uint8_t*>(p);
      seg->mappedBytes_ = bytes;
      seg->peer(nodeComm.rank)->pid = getpid();
      seg->pidNamespace_ = pidNamespaceId();
      seg->peer(nodeComm.rank)->pidNamespace = seg->pidNamespace_;
      __atomic_store_n(&seg->peer(nodeComm.rank)->cpu, -1, __ATOMIC_RELAXED);
      // what probeSingleCopy reads, readable before the barrier below
      seg->probeToken_ = kProbeMagic ^ static_cast<uint64_t>(getpid());
      seg->publish(&seg->probeToken_);
    }
  }
  if (fd >= 0) close(fd);
  // every rank has mapped it (or failed to): the name can go
  mpi::barrierOn(nodeComm, op, rankForErrors);
  if (nodeComm.rank == 0 && fd >= 0) shm_unlink(name);
  if (!made0 && error.empty()) error = "rank 0 of this node could not make the segment";
  if (!error.empty()) {
    *why = error;
    return nullptr;
  }
  return seg;
}

SharedSegment::~SharedSegment() {
  if (base_ != nullptr) munmap(base_, mappedBytes_);
}

SharedSegment::Peer* SharedSegment::peer(int rank) const {
  return reinterpret_cast<Peer*>(base_ + sizeof(Peer) * rank);
}

at::Tensor SharedSegment::slot(int rank, at::ScalarType dtype, int64_t elems) const {
  return at::from_blob(slotData(rank), {elems}, at::TensorOptions().dtype(dtype));
}

bool SharedSegment::seesPid(int rank) const { return peer(rank)->pidNamespace == pidNamespace_; }

void SharedSegment::giveUp() { __atomic_store_n(&peer(localRank_)->gaveUp, 1u, __ATOMIC_RELEASE); }

void SharedSegment::checkAlive(int rank, const char* op, int rankForErrors) const {
  if (__atomic_load_n(&peer(rank)->gaveUp, __ATOMIC_ACQUIRE) != 0) {
    // The failed rank may be on another node: name it as this rank's MPI knows it (the user
    // shrinks by it), waiting briefly where the failure notice has not reached this rank yet
    MPIGPU_THROW_BACKEND(op, rankForErrors, "local rank ", rank,
                         " of this node left the group's ops after a process of the job failed "
                         "(its MPI call reported the failure, and the group is revoked); ",
                         mpi::ft::onProcessFailure(0),
                         ". This op did not complete: its output tensors may hold partial "
                         "results. To go on, call torch.distributed.shrink_group(ranks_to_"
                         "exclude=<the failed ranks>, group=<the group>) on every survivor");
  }
  // A peer in another PID namespace (a container of its own that shares this host's name and
  // /dev/shm): its pid names no process here, or another one. Its death is the launcher's to see.
  if (!seesPid(rank)) return;
  const auto pid = static_cast<pid_t>(peer(rank)->pid);
  if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
    if (mpi::ft::active()) {
      // ULFM: as an MPI call's process failure (the groups holding it are revoked)
      MPIGPU_THROW_BACKEND(op, rankForErrors, "local rank ", rank, " of this node (pid ", pid,
                           ") exited while this rank waited for it in shared memory; ",
                           mpi::ft::onProcessFailure(0),
                           ". This op did not complete: its output tensors may hold partial "
                           "results. To go on, call torch.distributed.shrink_group(ranks_to_"
                           "exclude=<the failed ranks>, group=<the group>) on every survivor");
    }
    MPIGPU_THROW_BACKEND(op, rankForErrors, "local rank ", rank, " of this node (pid ", pid,
                         ") exited while this rank waited for it in shared memory; the job "
                         "cannot go on: end it and see that rank's output for why it ended");
  }
}

namespace {
std::atomic<uint64_t> g_yieldsToPeerOnThisCpu{0};
std::atomic<uint64_t> g_singleCopyReads{0};

// Copies n bytes of process `pid` at `from` to `to` in this process; 0 or an errno.
int readProcess(pid_t pid, void* to, const void* from, size_t n) {
  auto* dst = static_cast<uint8_t*>(to);
  auto* src = static_cast<const uint8_t*>(from);
  while (n > 0) {
    iovec local{dst, n}, remote{const_cast<uint8_t*>(src), n};
    const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno;
    if (got == 0) return EFAULT;  // nothing read, no error: the range is not all mapped there
    dst += got;
    src += got;
    n -= static_cast<size_t>(got);
  }
  return 0;
}

std::string whyNoReads(int e) {
  if (e == EPERM)
    return c10::str(errnoText(e),
                    " (the kernel's ptrace rules forbid it: kernel.yama.ptrace_scope "
                    "above 0, or a container without CAP_SYS_PTRACE)");
  if (e == ENOSYS)
    return c10::str(errnoText(e),
                    " (a kernel without cross-memory attach, or a seccomp filter that blocks it)");
  return errnoText(e);
}
}  // namespace

uint64_t SharedSegment::singleCopyReads() {
  return g_singleCopyReads.load(std::memory_order_relaxed);
}

void SharedSegment::publish(const void* data) {
  peer(localRank_)->published = reinterpret_cast<uintptr_t>(data);
}

std::string SharedSegment::probeSingleCopy() const {
  for (int r = 0; r < localSize_; ++r) {
    if (r == localRank_) continue;
    const Peer* p = peer(r);
    if (!seesPid(r))
      return c10::str("local rank ", r, " runs in another PID namespace (a container of its own)");
    uint64_t token = 0;
    const int e = readProcess(static_cast<pid_t>(p->pid), &token,
                              reinterpret_cast<const void*>(p->published), sizeof token);
    if (e != 0)
      return c10::str("process_vm_readv of local rank ", r, " (pid ", p->pid, "): ", whyNoReads(e));
    if (token != (kProbeMagic ^ static_cast<uint64_t>(p->pid)))
      return c10::str("process_vm_readv of local rank ", r, " (pid ", p->pid,
                      ") read other bytes than that rank wrote");
  }
  return "";
}

void SharedSegment::readPublished(int rank, void* dst, int64_t offset, int64_t bytes,
                                  const char* op, int rankForErrors) const {
  const Peer* p = peer(rank);
  const auto* src = reinterpret_cast<const uint8_t*>(p->published) + offset;
  const int e = readProcess(static_cast<pid_t>(p->pid), dst, src, static_cast<size_t>(bytes));
  if (e == ESRCH) checkAlive(rank, op, rankForErrors);
  if (e != 0) {
    MPIGPU_THROW_BACKEND(op, rankForErrors, "reading local rank ", rank, "'s ", bytes,
                         " bytes directly (process_vm_readv) failed: ", whyNoReads(e),
                         "; TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES=1099511627776 copies through "
                         "shared memory instead");
  }
  g_singleCopyReads.fetch_add(1, std::memory_order_relaxed);
}

uint64_t SharedSegment::yieldsToPeerOnThisCpu() {
  return g_yieldsToPeerOnThisCpu.load(std::memory_order_relaxed);
}

void SharedSegment::sync(const char* op, int rankForErrors, const std::atomic<bool>& cancelled) {
  // sched_getcpu reads the kernel's rseq area (glibc >= 2.35) or the vDSO: no system call.
  const int cpu = sched_getcpu();
  __atomic_store_n(&peer(localRank_)->cpu, cpu, __ATOMIC_RELAXED);
  ++epoch_;
  __atomic_store_n(&peer(localRank_)->arrived, epoch_, __ATOMIC_RELEASE);
  using Clock = std::chrono::steady_clock;
  for (int r = 0; r < localSize_; ++r) {
    if (r == localRank_) continue;
    uint64_t* arrived = &peer(r)->arrived;
    if (__atomic_load_n(arrived, __ATOMIC_ACQUIRE) >= epoch_) continue;
    // A peer last seen on this CPU cannot arrive while this rank spins on it: yield at once.
    // Unbound ranks (mpirun --oversubscribe, srun without --cpu-bind, a busy node) land on one
    // CPU now and then; spinning there cost every barrier the whole spin (130-190 us an op on
    // the 2-core VM, docs/performance.md) where a yield hands over in a few microseconds.
    uint64_t spinLimit = spinLimit_;
    if (cpu >= 0 && __atomic_load_n(&peer(r)->cpu, __ATOMIC_RELAXED) == cpu) {
      spinLimit = 0;
      g_yieldsToPeerOnThisCpu.fetch_add(1, std::memory_order_relaxed);
    }
    const auto start = Clock::now();
    auto nextCheck = start + std::chrono::milliseconds(200);
    // oversubscribed: yields let the peer run; a peer far behind gets sleeps growing as MPI
    // waits do (a fixed 50 us cost 30% of a core in a 2 s wait, tests/mp/busy_wait.py)
    mpi::Backoff backoff(std::chrono::milliseconds(5), start);
    for (uint64_t spins = 0; __atomic_load_n(arrived, __ATOMIC_ACQUIRE) < epoch_; ++spins) {
      if (spins < spinLimit) {  // the peer is usually microseconds behind
        cpuRelax();
        continue;
      }
      backoff.pause();
      const auto now = Clock::now();
      if (now >= nextCheck) {
        checkAlive(r, op, rankForErrors);
        if (cancelled.load(std::memory_order_relaxed)) {
          MPIGPU_THROW_BACKEND(op, rankForErrors,
                               "the process group was aborted while this op waited for local rank ",
                               r, " in shared memory; create a new group to go on");
        }
        nextCheck = now + std::chrono::milliseconds(200);
      }
    }
  }
}

}  // namespace mpigpu::node
