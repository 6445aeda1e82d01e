#include "ProcessGroupMPIGPU.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include "Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Env.hpp"
#include "mpi/Types.hpp"
#include "engine/Watchdog.hpp"

namespace mpigpu {

using paths::Access;
using paths::OpBuffers;
using std::chrono::milliseconds;

namespace {

// ---- argument checks (caller thread): ValueError / TypeError naming op and rank ----

void checkTensor(const char* op, int rank, const at::Tensor& t) {
  MPIGPU_CHECK_VALUE(t.defined(), op, rank, "got an undefined tensor");
  MPIGPU_CHECK_TYPE(t.layout() == at::kStrided, op, rank, "only dense (strided) tensors are "
                    "supported, got layout ", t.layout(), "; call .to_dense() first");
  MPIGPU_CHECK_TYPE(!t.is_meta(), op, rank, "meta tensors have no data to communicate");
  MPIGPU_CHECK_TYPE(!t.is_quantized(), op, rank, "quantized tensors are not supported; "
                    "communicate t.int_repr() and the scale/zero point instead");
}

void checkSameDevice(const char* op, int rank, const at::Tensor& ref, const at::Tensor& t,
                     const char* what) {
  checkTensor(op, rank, t);
  MPIGPU_CHECK_TYPE(t.device() == ref.device(), op, rank, what, " is on ", t.device(),
                    " but the first tensor is on ", ref.device(),
                    "; all tensors of one call must be on one device");
}

void checkSameKind(const char* op, int rank, const at::Tensor& ref, const at::Tensor& t,
                   const char* what) {
  checkSameDevice(op, rank, ref, t, what);
  MPIGPU_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, rank, what, " has dtype ",
                    t.scalar_type(), " but the first tensor has ", ref.scalar_type(),
                    "; all tensors of one call must share a dtype");
}

void checkSingle(const char* op, int rank, const std::vector<at::Tensor>& ts) {
  MPIGPU_CHECK_VALUE(ts.size() == 1, op, rank, "expects exactly one tensor per call, got ",
                     ts.size(), " (one tensor per process; use a list op for several)");
  checkTensor(op, rank, ts[0]);
}

void checkRank(const char* op, int rank, int size, int64_t peer, const char* what) {
  MPIGPU_CHECK_VALUE(peer >= 0 && peer < size, op, rank, what, " ", peer,
                     " is out of range for a group of ", size, " ranks");
}

// The backend's profiler event names, as gloo and NCCL write theirs ("nccl:all_reduce"), so
// trace viewers group them with the c10d op. Static strings: the Work keeps the pointer.
const char* profilingTitle(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "mpigpu:broadcast";
    case c10d::OpType::ALLREDUCE: return "mpigpu:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "mpigpu:all_reduce_coalesced";
    case c10d::OpType::REDUCE: return "mpigpu:reduce";
    case c10d::OpType::ALLGATHER: return "mpigpu:all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "mpigpu:_allgather_base";
    case c10d::OpType::ALLGATHER_COALESCED: return "mpigpu:all_gather_coalesced";
    case c10d::OpType::GATHER: return "mpigpu:gather";
    case c10d::OpType::SCATTER: return "mpigpu:scatter";
    case c10d::OpType::REDUCE_SCATTER: return "mpigpu:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "mpigpu:_reduce_scatter_base";
    case c10d::OpType::ALLTOALL_BASE: return "mpigpu:all_to_all_single";
    case c10d::OpType::ALLTOALL: return "mpigpu:all_to_all";
    case c10d::OpType::SEND: return "mpigpu:send";
    case c10d::OpType::RECV:
    case c10d::OpType::RECVANYSOURCE: return "mpigpu:recv";
    case c10d::OpType::BARRIER: return "mpigpu:barrier";
    case c10d::OpType::COALESCED: return "mpigpu:coalesced";
    default: return "mpigpu:unknown";
  }
}

int tagFor(const std::string& groupName) {
  // Same on every member (group names are agreed by torch), distinct per group.
  return static_cast<int>(std::hash<std::string>{}(groupName) % 32000) + 1;
}

std::vector<int> resolveWorldRanks(int rank, int size, const std::vector<int64_t>& globalRanks) {
  const auto& env = mpi::ensureInitialized();
  const char* op = "init_process_group";
  if (globalRanks.empty()) {
    if (env.worldSize == 1 && size > 1) {
      MPIGPU_THROW_BACKEND(op, rank, "this process is not part of a multi-process MPI job (MPI "
                           "world size 1, store world size ", size, "). mpigpu needs an MPI "
                           "launcher: run `mpirun -np ", size, " python your_script.py` (or srun/"
                           "mpiexec) instead of torchrun or manual RANK/WORLD_SIZE");
    }
    if (env.worldSize != size || env.worldRank != rank) {
      MPIGPU_THROW_BACKEND(op, rank, "the store's rank/world size (", rank, "/", size,
                           ") disagree with MPI's (", env.worldRank, "/", env.worldSize,
                           "). Let torch_mpi_gpu set RANK/WORLD_SIZE from the MPI launcher (unset "
                           "them), or pass rank=MPI rank and world_size=MPI size");
    }
    std::vector<int> all(size);
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  MPIGPU_CHECK_VALUE(static_cast<int>(globalRanks.size()) == size, "new_group", rank,
                     "group of size ", size, " got ", globalRanks.size(), " global ranks");
  std::vector<int> ranks;
  for (int64_t g : globalRanks) {
    MPIGPU_CHECK_VALUE(g >= 0 && g < env.worldSize, "new_group", rank, "global rank ", g,
                       " is not in MPI_COMM_WORLD (size ", env.worldSize, ")");
    ranks.push_back(static_cast<int>(g));
  }
  if (ranks[rank] != env.worldRank) {
    MPIGPU_THROW_BACKEND("new_group", rank, "group rank ", rank, " is global rank ", ranks[rank],
                         " but this process is MPI rank ", env.worldRank,
                         "; the default group's ranks must equal MPI_COMM_WORLD ranks");
  }
  return ranks;
}

} // namespace

ProcessGroupMPIGPU::ProcessGroupMPIGPU(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                       std::vector<int64_t> globalRanks, milliseconds timeout,
                                       std::string groupName)
    : Backend(rank, size),
      store_(std::move(store)),
      groupName_(std::move(groupName)),
      worldRanks_(resolveWorldRanks(rank, size, globalRanks)),
      config_(Config::fromEnv()),
      timeoutMs_(config_.timeoutSeconds > 0 ? static_cast<int64_t>(config_.timeoutSeconds * 1000)
                                            : timeout.count()) {
  comm_.rank = rank;
  comm_.size = size;
  comm_.maxCount = config_.maxElementsPerCall;
  algoComm_ = comm_;
  paths_ = std::make_unique<paths::PathFactory>(config_);
  engine_ = Engine::create("mpigpu-" + groupName_);
  const int hasGpu = at::hasCUDA() ? 1 : 0;
  engine_->runAndWait("new_group", rank, [this, hasGpu] {
    comm_.handle = mpi::createGroupComm(worldRanks_, tagFor(groupName_), rank_);
    int commRank = -1;
    MPI_Comm_rank(comm_.handle, &commRank);
    if (commRank != rank_) {
      MPIGPU_THROW_BACKEND("new_group", rank_, "MPI placed this process at rank ", commRank,
                           " of the new communicator, torch at ", rank_);
    }
    MPIGPU_MPI_CHECK(MPI_Comm_dup(comm_.handle, &algoComm_.handle), "new_group", rank_);
    int anyGpu = 0;
    MPIGPU_MPI_CHECK(MPI_Allreduce(&hasGpu, &anyGpu, 1, MPI_INT, MPI_MAX, comm_.handle),
                     "new_group", rank_);
    groupHasGpu_ = anyGpu != 0;
  });
  if (config_.debug) {
    std::cerr << opMessage("init", rank_, describe()) << std::endl;
  }
  if (store_) Watchdog::addGroup({groupName_, rank_, size_, store_, collectives_});
}

namespace {
// Engines whose worker is stuck inside MPI after abort(): the thread still uses them.
void keepAliveUntilExit(std::shared_ptr<Engine> engine) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<Engine>>();
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(engine));
}
} // namespace

ProcessGroupMPIGPU::~ProcessGroupMPIGPU() {
  try {
    shutdown();
  } catch (...) {
    // Destructors must not throw; at worst the communicators leak until MPI_Finalize.
  }
}

std::shared_ptr<Engine> ProcessGroupMPIGPU::currentEngine(const char* op) const {
  std::lock_guard<std::mutex> lock(engineMutex_);
  MPIGPU_CHECK_VALUE(engine_ != nullptr, op, rank_,
                     "the process group has been destroyed or aborted; create a new one");
  return engine_;
}

void ProcessGroupMPIGPU::shutdown() {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(engineMutex_);
    engine = engine_;
  }
  if (!engine) return;
  Watchdog::removeGroup(groupName_, rank_);
  if (!engine->stopped() && !mpi::isFinalized()) {
    // Ops still queued run first, in issue order (their peers may be inside them already); then
    // the communicators are freed. Bounded by the group's timeout: an op whose peers never come
    // would otherwise hold destroy_process_group() forever.
    const bool done = engine->runAndWait("destroy_process_group", rank_, [this] {
      mpi::freeComm(&algoComm_.handle);
      mpi::freeComm(&comm_.handle);
    }, timeout());
    if (!done) {
      std::cerr << opMessage("destroy_process_group", rank_, "group '", groupName_,
                             "': the ops ahead of it did not finish within the timeout (",
                             timeout().count(), " ms); aborting the group instead (its "
                             "outstanding ops fail)") << std::endl;
      abort();
      return;
    }
  }
  std::lock_guard<std::mutex> lock(engineMutex_);
  engine_.reset();  // (the engine stops with its last group: it may be shared)
}

void ProcessGroupMPIGPU::abort() {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(engineMutex_);
    engine = std::move(engine_);
  }
  if (!engine) return;
  Watchdog::removeGroup(groupName_, rank_);
  // Not freed: MPI_Comm_free is collective in spirit, and an op stuck in MPI still uses them.
  const bool stopped = engine->abort("was aborted (the process group's abort())");
  if (!stopped) keepAliveUntilExit(std::move(engine));
}

std::string ProcessGroupMPIGPU::describe() const {
  const auto& env = mpi::ensureInitialized();
  std::ostringstream s;
  s << "group '" << groupName_ << "' rank " << rank_ << "/" << size_ << " (world ranks";
  for (int r : worldRanks_) s << " " << r;
  s << "), " << env.libraryVersion << ", " << mpi::threadLevelName(env.threadLevel)
    << ", timeout " << timeout().count() << " ms, max elements per MPI call "
    << config_.maxElementsPerCall << ", fusion up to " << config_.fusionBytes
    << " bytes per MPI call; paths: CPU tensors cpu, CUDA tensors "
    << paths::pathName(paths_->cudaPath()) << " (" << paths_->cudaPathReason()
    << "; staging pieces of " << config_.stagingChunkBytes << " bytes), CUDA reductions "
    << paths::pathName(paths_->cudaReducePath()) << " (" << paths_->cudaReducePathReason()
    << "), other devices via-cpu; reductions: "
    << algo::describeChoice(config_, groupHasGpu_);
  if (paths_->cudaPath() != paths::PathKind::ViaCpu) {
    s << "; CUDA reductions by our algorithms stay on the GPU, messages "
      << (paths_->cudaPath() != paths::PathKind::CudaDirect ? "through pinned host memory"
          : config_.cudaReduce == 1 ? "as device pointers"
          : config_.cudaReduce == 0 ? "through pinned host memory"
          : c10::str("as device pointers from ", config_.cudaDirectBytes,
                     " bytes, through pinned host memory below"));
  }
  return s.str();
}

algo::Algo ProcessGroupMPIGPU::chooseAlgo(algo::OpKind kind,
                                          const std::vector<at::Tensor>& tensors) const {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return algo::choose(config_, kind, bytes, tensors[0].scalar_type(), size_, groupHasGpu_);
}

void ProcessGroupMPIGPU::withAlgorithm(const OpBuffers& bufs, const char* op,
                                       const at::Tensor& buf, const mpi::Reduction& red,
                                       const std::function<void(algo::Context&)>& fn) const {
  const int64_t bytes = buf.numel() * static_cast<int64_t>(buf.element_size());
  // Device messages need a CUDA-aware MPI; below cudaDirectBytes pinned staging is cheaper.
  const bool staged = paths_->cudaPath() != paths::PathKind::CudaDirect ||
                      config_.cudaReduce == 0 ||
                      (config_.cudaReduce == -1 && bytes < config_.cudaDirectBytes);
  auto link = bufs.link(algoComm_, op, staged);
  auto reducer = bufs.reducer(red.kind);
  const int64_t piece = std::clamp<int64_t>(
      config_.algoPieceBytes / static_cast<int64_t>(buf.element_size()), 1, algoComm_.maxCount);
  algo::Context ctx{*link, *reducer, red, piece};
  fn(ctx);
}

milliseconds ProcessGroupMPIGPU::effectiveTimeout(milliseconds optTimeout) const {
  return optTimeout == c10d::kUnsetTimeout ? timeout() : optTimeout;
}

void ProcessGroupMPIGPU::setTimeout(milliseconds timeout) {
  if (config_.timeoutSeconds > 0) return;  // TORCH_MPIGPU_TIMEOUT overrides every timeout
  timeoutMs_.store(timeout.count(), std::memory_order_relaxed);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::enqueue(c10d::OpType type, const char* op,
                                                           std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> inputs,
                                                           milliseconds optTimeout,
                                                           bool asyncOp,
                                                           std::shared_ptr<OpBuffers> bufs,
                                                           Body body, int root) {
  const auto engine = currentEngine(op);
  // The group's collective number: the same on every rank (point-to-point ops have their own).
  const uint64_t seq = ++*collectives_;
  bufs->issued();
  auto work = c10::make_intrusive<WorkMPIGPU>(rank_, type, op, seq, std::move(outputs),
                                              effectiveTimeout(optTimeout), profilingTitle(type),
                                              std::optional<std::vector<at::Tensor>>(inputs),
                                              std::vector<std::shared_ptr<OpBuffers>>{bufs});
  if (config_.debug) {
    std::cerr << opMessage(op, rank_, "op #", seq, " queued (", paths::pathName(bufs->kind()),
                           " path)") << std::endl;
  }
  bool coalescing;
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    coalescing = coalescing_;
    if (coalescing) coalesced_.push_back(work);
  }
  // What every rank must agree on (checked before the op with TORCH_MPIGPU_DESYNC_CHECK=1 only).
  Fingerprint fp{static_cast<int64_t>(type), -1, -1, root};
  if (config_.desyncCheck) {
    const auto& described = type == c10d::OpType::SCATTER || inputs.empty() ? outputs : inputs;
    if (!described.empty()) fp.dtype = static_cast<int64_t>(described[0].scalar_type());
    if (type != c10d::OpType::ALLTOALL && type != c10d::OpType::ALLTOALL_BASE) {
      fp.numel = 0;
      for (const auto& t : described) fp.numel += t.numel();
    }
  }
  const int64_t bytes = bufs->bytes();
  const bool host = bufs->kind() == paths::PathKind::Cpu;
  const bool small = bytes <= config_.inlineBytes;
  Watchdog::Op watched{groupName_, op, seq, rank_, bytes,
                       effectiveTimeout(optTimeout), false, config_.abortOnTimeout};
  Engine::Task task = [this, engine = engine.get(), watched, fp, bufs = std::move(bufs),
                       body = std::move(body)]() mutable {
    const bool onCaller = !engine->onWorkerThread();
    watched.onCaller = onCaller;
    const char* name = watched.name;
    const uint64_t seq = watched.seq;
    Watchdog::Scope watch(std::move(watched));
    if (config_.desyncCheck) checkSameOp(name, seq, fp);
    {
      auto onCommStream = bufs->enter();
      bufs->stageIn();
      body(*bufs);
      bufs->stageOut();
    }
    bufs->release();
    return true;
  };
  // The caller waits for this op right away (async_op=False): when it is small, on the host and
  // the engine is idle, run it here. The hand-off to the worker and the two thread wake-ups cost
  // more than a small MPI call itself.
  if (!asyncOp && host && small && !coalescing && engine->tryRunInline(work, task)) return work;
  engine->submit(work, std::move(task));
  return work;
}

void ProcessGroupMPIGPU::checkSameOp(const char* op, uint64_t seq, const Fingerprint& mine) {
  // One small allgather: every rank issues it before the op, so it matches even when the ops
  // do not, and every rank sees the same table and raises the same error.
  std::vector<Fingerprint> all(size_);
  static_assert(sizeof(Fingerprint) == 4 * sizeof(int64_t), "Fingerprint must be 4 int64");
  MPIGPU_MPI_CHECK(MPI_Allgather(&mine, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, comm_.handle),
                   op, rank_);
  auto same = [&](const Fingerprint& f) {
    return f.type == all[0].type && f.dtype == all[0].dtype && f.numel == all[0].numel &&
           f.root == all[0].root;
  };
  if (std::all_of(all.begin(), all.end(), same)) return;
  std::ostringstream table;
  for (int r = 0; r < size_; ++r) {
    const auto& f = all[r];
    table << "\n  rank " << r << ": " << c10d::opTypeToString(static_cast<c10d::OpType>(f.type));
    if (f.dtype >= 0) table << " " << static_cast<at::ScalarType>(f.dtype);
    if (f.numel >= 0) table << ", " << f.numel << " elements";
    if (f.root >= 0) table << ", root " << f.root;
    if (!same(f)) table << "   <- differs from rank 0";
  }
  MPIGPU_THROW_BACKEND(op, rank_, "op #", seq, ": the ranks of group '", groupName_,
                       "' are not issuing the same collective (TORCH_MPIGPU_DESYNC_CHECK=1):",
                       table.str(), "\nEvery rank must call the same collectives in the same "
                       "order with matching dtype, size and root. The op was not run.");
}

void ProcessGroupMPIGPU::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalesceMutex_);
  MPIGPU_CHECK_VALUE(!coalescing_, "start_coalescing", rank_,
                     "coalescing already started; end the previous block first");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::endCoalescing() {
  std::vector<c10::intrusive_ptr<WorkMPIGPU>> parts;
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    MPIGPU_CHECK_VALUE(coalescing_, "end_coalescing", rank_, "coalescing was not started");
    coalescing_ = false;
    parts.swap(coalesced_);
  }
  return combineWorks(rank_, "coalesced", collectives_->load(), parts, timeout());
}

// ---------------------------------------------------------------------------------------------
// Fusion: many tensors of one dtype travel back to back in one MPI call, up to fusionBytes.

namespace {

// Indices of `ts` grouped by dtype (first-seen order), each group cut into runs of at most
// `limit` bytes. A tensor larger than that, or of at least `alone` bytes, travels alone.
std::vector<std::vector<size_t>> fusionBuckets(const std::vector<at::Tensor>& ts, int64_t limit,
                                               int64_t alone) {
  std::vector<at::ScalarType> order;
  std::map<at::ScalarType, std::vector<size_t>> byDtype;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto dt = ts[i].scalar_type();
    if (!byDtype.count(dt)) order.push_back(dt);
    byDtype[dt].push_back(i);
  }
  std::vector<std::vector<size_t>> buckets;
  for (auto dt : order) {
    std::vector<size_t> cur;
    int64_t bytes = 0;
    for (size_t i : byDtype[dt]) {
      const int64_t b = ts[i].numel() * static_cast<int64_t>(ts[i].element_size());
      if (b >= alone && b > 0) {
        buckets.push_back({i});
        continue;
      }
      if (!cur.empty() && bytes + b > limit) {
        buckets.push_back(std::move(cur));
        cur.clear();
        bytes = 0;
      }
      cur.push_back(i);
      bytes += b;
    }
    if (!cur.empty()) buckets.push_back(std::move(cur));
  }
  return buckets;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& ts, const std::vector<size_t>& idx) {
  std::vector<at::Tensor> out;
  out.reserve(idx.size());
  for (size_t i : idx) out.push_back(ts[i]);
  return out;
}

// Rank-major row views: row r of every tensor (seen as [size, n]), for r = 0..size-1. An allgather
// of packed inputs lands in exactly this order, and a reduce-scatter reads it.
std::vector<at::Tensor> rankMajorRows(const std::vector<at::Tensor>& ts, int size) {
  std::vector<at::Tensor> rows;
  rows.reserve(ts.size() * size);
  for (int r = 0; r < size; ++r) {
    for (const auto& t : ts) rows.push_back(t.view({size, -1}).select(0, r));
  }
  return rows;
}

} // namespace

// On the host a big tensor is cheaper sent in place than copied into a bucket; on a device the
// pack is one fast kernel and saves MPI calls (and host<->device copies when staged).
int64_t ProcessGroupMPIGPU::fuseBelow(const OpBuffers& bufs) const {
  const bool host = bufs.kind() == paths::PathKind::Cpu || bufs.kind() == paths::PathKind::ViaCpu;
  return host ? config_.fuseBelowBytes : std::numeric_limits<int64_t>::max();
}

// ---------------------------------------------------------------------------------------------
// Reductions

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  MPIGPU_CHECK_VALUE(!tensors.empty(), op, rank_, "got an empty tensor list");
  for (const auto& t : tensors) checkSameDevice(op, rank_, tensors[0], t, "a tensor");
  struct Bucket {
    size_t slot;
    mpi::Reduction red;
    algo::Algo algo;
  };
  // The whole op decides whose collectives it uses (its buffers depend on it), each bucket which
  // of our algorithms.
  const bool ours = chooseAlgo(algo::OpKind::Allreduce, tensors) != algo::Algo::Mpi;
  auto bufs = ours ? paths_->createForAlgorithm(tensors[0].device()) : reduceBuffersFor(tensors[0]);
  std::vector<Bucket> buckets;
  for (const auto& idx : fusionBuckets(tensors, config_.fusionBytes, fuseBelow(*bufs))) {
    auto red = mpi::resolveReduction(opts.reduceOp, tensors[idx[0]].scalar_type(), op, rank_);
    auto a = ours ? chooseAlgo(algo::OpKind::Allreduce, pick(tensors, idx)) : algo::Algo::Mpi;
    if (ours && a == algo::Algo::Mpi) a = algo::Algo::Ring;
    buckets.push_back({bufs->add(pick(tensors, idx), Access::ReadWrite, /*elementwise=*/true),
                       std::move(red), a});
  }
  return enqueue(c10d::OpType::ALLREDUCE, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
                 [this, op, buckets](OpBuffers& b) {
                   for (const auto& k : buckets) {
                     b.run(k.slot, [&](at::Tensor& t) {
                       if (k.algo == algo::Algo::Mpi) {
                         mpi::allreduceInPlace(comm_, op, t, k.red);
                         return;
                       }
                       withAlgorithm(b, op, t, k.red,
                                     [&](algo::Context& c) { algo::allreduce(c, k.algo, t); });
                     });
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  MPIGPU_CHECK_TYPE(false, "allreduce", rank_, "sparse tensors are not supported; call "
                    ".to_dense() first (or all_gather the indices and values)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  checkSingle(op, rank_, tensors);
  checkRank(op, rank_, size_, opts.rootRank, "root");
  MPIGPU_CHECK_VALUE(opts.rootTensor == 0, op, rank_, "rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  auto red = mpi::resolveReduction(opts.reduceOp, tensors[0].scalar_type(), op, rank_);
  const bool ours = chooseAlgo(algo::OpKind::Reduce, tensors) != algo::Algo::Mpi;
  auto bufs = ours ? paths_->createForAlgorithm(tensors[0].device()) : reduceBuffersFor(tensors[0]);
  // Only the root's tensor changes.
  const size_t slot = bufs->add(tensors[0], rank_ == root ? Access::ReadWrite : Access::Read,
                                /*elementwise=*/true);
  return enqueue(c10d::OpType::REDUCE, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
                 [this, op, slot, red, root, ours](OpBuffers& b) {
                   b.run(slot, [&](at::Tensor& t) {
                     if (!ours) {
                       mpi::reduce(comm_, op, t, t, red, root);
                       return;
                     }
                     withAlgorithm(b, op, t, red, [&](algo::Context& c) { algo::reduce(c, t, root); });
                   });
                 }, root);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  checkSingle(op, rank_, outputs);
  MPIGPU_CHECK_VALUE(inputs.size() == 1, op, rank_, "expects one input list, got ", inputs.size());
  MPIGPU_CHECK_VALUE(static_cast<int>(inputs[0].size()) == size_, op, rank_, "input list has ",
                     inputs[0].size(), " tensors, the group has ", size_, " ranks");
  for (const auto& t : inputs[0]) {
    checkSameKind(op, rank_, outputs[0], t, "an input");
    MPIGPU_CHECK_VALUE(t.numel() == outputs[0].numel(), op, rank_, "every input must have the "
                       "output's ", outputs[0].numel(), " elements, one has ", t.numel());
  }
  auto red = mpi::resolveReduction(opts.reduceOp, outputs[0].scalar_type(), op, rank_);
  const bool ours = chooseAlgo(algo::OpKind::ReduceScatter, inputs[0]) != algo::Algo::Mpi;
  auto bufs = ours ? paths_->createForAlgorithm(outputs[0].device()) : reduceBuffersFor(outputs[0]);
  const size_t in = bufs->add(inputs[0], Access::Read);
  const size_t out = bufs->add(outputs[0], Access::Write);
  return enqueue(c10d::OpType::REDUCE_SCATTER, op, outputs, inputs[0], opts.timeout, opts.asyncOp, bufs,
                 [this, op, in, out, red, ours](OpBuffers& b) {
                   if (!ours) {
                     mpi::reduceScatter(comm_, op, b.mpi(in), b.mpi(out), red);
                     return;
                   }
                   withAlgorithm(b, op, b.mpi(in), red, [&](algo::Context& c) {
                     algo::reduceScatter(c, b.mpi(in), b.mpi(out));
                   });
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  MPIGPU_CHECK_VALUE(outputs.size() == inputs.size() && !outputs.empty(), op, rank_,
                     "needs as many outputs as inputs (and at least one), got ", outputs.size(),
                     " and ", inputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkSameDevice(op, rank_, outputs[0], outputs[i], "an output");
    checkSameKind(op, rank_, outputs[i], inputs[i], "the input");
    MPIGPU_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_, op, rank_,
                       "input must have group size (", size_, ") x output elements (",
                       outputs[i].numel(), "), got ", inputs[i].numel());
  }
  // One MPI call per bucket: the inputs' rank-r rows are packed rank-major, so block r of the
  // packed buffer is everything rank r receives.
  struct Bucket {
    size_t in, out;
    mpi::Reduction red;
  };
  const bool ours = chooseAlgo(algo::OpKind::ReduceScatter, inputs) != algo::Algo::Mpi;
  auto bufs = ours ? paths_->createForAlgorithm(outputs[0].device()) : reduceBuffersFor(outputs[0]);
  std::vector<Bucket> buckets;
  for (const auto& idx : fusionBuckets(outputs, config_.fusionBytes, fuseBelow(*bufs))) {
    std::vector<at::Tensor> ins;
    for (size_t i : idx) ins.push_back(inputs[i].reshape({size_, -1}));
    auto red = mpi::resolveReduction(opts.reduceOp, outputs[idx[0]].scalar_type(), op, rank_);
    // A single input is rank-major already: MPI reads it as it is.
    buckets.push_back({bufs->add(idx.size() == 1 ? pick(inputs, idx) : rankMajorRows(ins, size_),
                                 Access::Read),
                       bufs->add(pick(outputs, idx), Access::Write), std::move(red)});
  }
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, op, outputs, inputs, opts.timeout, opts.asyncOp, bufs,
                 [this, op, buckets, ours](OpBuffers& b) {
                   for (const auto& k : buckets) {
                     if (!ours) {
                       mpi::reduceScatter(comm_, op, b.mpi(k.in), b.mpi(k.out), k.red);
                       continue;
                     }
                     withAlgorithm(b, op, b.mpi(k.in), k.red, [&](algo::Context& c) {
                       algo::reduceScatter(c, b.mpi(k.in), b.mpi(k.out));
                     });
                   }
                 });
}

// ---------------------------------------------------------------------------------------------
// Data movement

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  checkSingle(op, rank_, tensors);
  checkRank(op, rank_, size_, opts.rootRank, "root");
  MPIGPU_CHECK_VALUE(opts.rootTensor == 0, op, rank_, "rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  mpi::transportType(tensors[0].scalar_type(), op, rank_);
  auto bufs = buffersFor(tensors[0]);
  const size_t slot = bufs->add(tensors[0], rank_ == root ? Access::Read : Access::Write,
                                /*elementwise=*/true);
  return enqueue(c10d::OpType::BROADCAST, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
                 [this, op, slot, root](OpBuffers& b) {
                   b.run(slot, [&](at::Tensor& t) { mpi::broadcast(comm_, op, t, root); });
                 }, root);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "allgather";
  checkSingle(op, rank_, inputs);
  MPIGPU_CHECK_VALUE(outputs.size() == 1, op, rank_, "expects one output list, got ",
                     outputs.size());
  MPIGPU_CHECK_VALUE(static_cast<int>(outputs[0].size()) == size_, op, rank_, "output list has ",
                     outputs[0].size(), " tensors, the group has ", size_, " ranks");
  for (const auto& t : outputs[0]) {
    checkSameKind(op, rank_, inputs[0], t, "an output");
    MPIGPU_CHECK_VALUE(t.numel() == inputs[0].numel(), op, rank_, "every output must have the "
                       "input's ", inputs[0].numel(), " elements, one has ", t.numel());
  }
  mpi::transportType(inputs[0].scalar_type(), op, rank_);
  auto bufs = buffersFor(inputs[0]);
  const size_t in = bufs->add(inputs[0], Access::Read);
  const size_t out = bufs->add(outputs[0], Access::Write);
  return enqueue(c10d::OpType::ALLGATHER, op, outputs[0], inputs, opts.timeout, opts.asyncOp, bufs,
                 [this, op, in, out](OpBuffers& b) {
                   mpi::allgather(comm_, op, b.mpi(in), b.mpi(out));
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return allgather_into_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  MPIGPU_CHECK_VALUE(outputs.size() == inputs.size() && !outputs.empty(), op, rank_,
                     "needs as many outputs as inputs (and at least one), got ", outputs.size(),
                     " and ", inputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkSameDevice(op, rank_, inputs[0], inputs[i], "an input");
    checkSameKind(op, rank_, inputs[i], outputs[i], "the output");
    MPIGPU_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_, op, rank_,
                       "output must have group size (", size_, ") x input elements (",
                       inputs[i].numel(), "), got ", outputs[i].numel());
    mpi::transportType(inputs[i].scalar_type(), op, rank_);
  }
  // One MPI call per bucket: packed inputs gather rank-major, which is the outputs' rank-r rows
  // in order. A non-contiguous output has no row views and travels alone.
  struct Bucket {
    size_t in, out;
  };
  auto bufs = buffersFor(inputs[0]);
  std::vector<Bucket> buckets;
  auto addBucket = [&](const std::vector<size_t>& idx) {
    std::vector<at::Tensor> outs = pick(outputs, idx);
    buckets.push_back({bufs->add(pick(inputs, idx), Access::Read),
                       bufs->add(idx.size() == 1 ? outs : rankMajorRows(outs, size_),
                                 Access::Write)});
  };
  for (const auto& idx : fusionBuckets(inputs, config_.fusionBytes, fuseBelow(*bufs))) {
    std::vector<size_t> fused;
    for (size_t i : idx) {
      if (outputs[i].is_contiguous()) fused.push_back(i);
      else addBucket({i});
    }
    if (!fused.empty()) addBucket(fused);
  }
  return enqueue(c10d::OpType::_ALLGATHER_BASE, op, outputs, inputs, opts.timeout, opts.asyncOp, bufs,
                 [this, op, buckets](OpBuffers& b) {
                   for (const auto& k : buckets) mpi::allgather(comm_, op, b.mpi(k.in), b.mpi(k.out));
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  MPIGPU_CHECK_VALUE(outputLists.size() == static_cast<size_t>(size_), op, rank_,
                     "expects one output list per rank (", size_, "), got ", outputLists.size());
  MPIGPU_CHECK_VALUE(!inputs.empty(), op, rank_, "got an empty input list");
  for (const auto& t : inputs) checkSameKind(op, rank_, inputs[0], t, "an input");
  std::vector<at::Tensor> allOuts;
  for (const auto& list : outputLists) {
    MPIGPU_CHECK_VALUE(list.size() == inputs.size(), op, rank_, "every output list must have ",
                       inputs.size(), " tensors (one per input), one has ", list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      checkSameKind(op, rank_, inputs[i], list[i], "an output");
      MPIGPU_CHECK_VALUE(list[i].numel() == inputs[i].numel(), op, rank_,
                         "output sizes must match the inputs");
      allOuts.push_back(list[i]);
    }
  }
  mpi::transportType(inputs[0].scalar_type(), op, rank_);
  auto bufs = buffersFor(inputs[0]);
  const size_t in = bufs->add(inputs, Access::Read);
  const size_t out = bufs->add(allOuts, Access::Write);  // rank-major, input order within a rank
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, op, allOuts, inputs, opts.timeout, opts.asyncOp, bufs,
                 [this, op, in, out](OpBuffers& b) {
                   mpi::allgather(comm_, op, b.mpi(in), b.mpi(out));
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* op = "gather";
  checkSingle(op, rank_, inputs);
  checkRank(op, rank_, size_, opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = rank_ == root;
  std::vector<at::Tensor> outs;
  if (isRoot) {
    MPIGPU_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, op,
                       rank_, "the root needs one output list of ", size_, " tensors");
    for (const auto& t : outputs[0]) {
      checkSameKind(op, rank_, inputs[0], t, "an output");
      MPIGPU_CHECK_VALUE(t.numel() == inputs[0].numel(), op, rank_, "every output must have the "
                         "input's ", inputs[0].numel(), " elements, one has ", t.numel());
    }
    outs = outputs[0];
  } else {
    MPIGPU_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), op, rank_,
                       "only the root (rank ", root, ") takes output tensors");
  }
  mpi::transportType(inputs[0].scalar_type(), op, rank_);
  auto bufs = buffersFor(inputs[0]);
  const size_t in = bufs->add(inputs[0], Access::Read);
  const size_t out = isRoot ? bufs->add(outs, Access::Write) : 0;
  return enqueue(c10d::OpType::GATHER, op, outs, inputs, opts.timeout, opts.asyncOp, bufs,
                 [this, op, in, out, root, isRoot](OpBuffers& b) {
                   mpi::gather(comm_, op, b.mpi(in), isRoot ? &b.mpi(out) : nullptr, root);
                 }, root);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  checkSingle(op, rank_, outputs);
  checkRank(op, rank_, size_, opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = rank_ == root;
  std::vector<at::Tensor> ins;
  if (isRoot) {
    MPIGPU_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, op,
                       rank_, "the root needs one input list of ", size_, " tensors");
    for (const auto& t : inputs[0]) {
      checkSameKind(op, rank_, outputs[0], t, "an input");
      MPIGPU_CHECK_VALUE(t.numel() == outputs[0].numel(), op, rank_, "every input must have the "
                         "output's ", outputs[0].numel(), " elements, one has ", t.numel());
    }
    ins = inputs[0];
  } else {
    MPIGPU_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), op, rank_,
                       "only the root (rank ", root, ") takes input tensors");
  }
  mpi::transportType(outputs[0].scalar_type(), op, rank_);
  auto bufs = buffersFor(outputs[0]);
  const size_t in = isRoot ? bufs->add(ins, Access::Read) : 0;
  const size_t out = bufs->add(outputs[0], Access::Write);
  return enqueue(c10d::OpType::SCATTER, op, outputs, ins, opts.timeout, opts.asyncOp, bufs,
                 [this, op, in, out, root, isRoot](OpBuffers& b) {
                   mpi::scatter(comm_, op, isRoot ? &b.mpi(in) : nullptr, b.mpi(out), root);
                 }, root);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  checkTensor(op, rank_, input);
  checkSameKind(op, rank_, input, output, "the output");
  mpi::transportType(input.scalar_type(), op, rank_);
  // Splits are along dim 0; counts are in elements.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) {
    std::vector<int64_t> c(size_);
    if (splits.empty()) {
      MPIGPU_CHECK_VALUE(t.numel() % size_ == 0, op, rank_, what, " has ", t.numel(),
                         " elements, which do not divide evenly across ", size_, " ranks; give "
                         "split sizes");
      std::fill(c.begin(), c.end(), t.numel() / size_);
      return c;
    }
    MPIGPU_CHECK_VALUE(static_cast<int>(splits.size()) == size_, op, rank_, what, " split sizes "
                       "have ", splits.size(), " entries, the group has ", size_, " ranks");
    MPIGPU_CHECK_VALUE(t.dim() > 0, op, rank_, what, " is a scalar and cannot be split");
    const int64_t sum = std::accumulate(splits.begin(), splits.end(), int64_t{0});
    MPIGPU_CHECK_VALUE(sum == t.size(0), op, rank_, what, " split sizes sum to ", sum,
                       " but dim 0 is ", t.size(0));
    const int64_t row = t.size(0) == 0 ? 0 : t.numel() / t.size(0);
    for (int p = 0; p < size_; ++p) {
      MPIGPU_CHECK_VALUE(splits[p] >= 0, op, rank_, what, " split sizes must be >= 0");
      c[p] = splits[p] * row;
    }
    return c;
  };
  auto sendCounts = counts(input, inputSplitSizes, "input");
  auto recvCounts = counts(output, outputSplitSizes, "output");
  // Without split sizes every rank sends the same counts (torch requires equal sizes then).
  const bool uniform = inputSplitSizes.empty() && outputSplitSizes.empty() &&
                       input.numel() == output.numel();
  auto bufs = buffersFor(input);
  const size_t in = bufs->add(input, Access::Read);
  const size_t out = bufs->add(output, Access::Write);
  return enqueue(c10d::OpType::ALLTOALL_BASE, op, {output}, {input}, opts.timeout, opts.asyncOp,
                 bufs, [this, op, in, out, sendCounts, recvCounts, uniform](OpBuffers& b) {
                   mpi::alltoallv(comm_, op, b.mpi(in), sendCounts, b.mpi(out), recvCounts,
                                  uniform);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  MPIGPU_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ &&
                         static_cast<int>(outputs.size()) == size_, op, rank_,
                     "needs one input and one output tensor per rank (", size_, "), got ",
                     inputs.size(), " and ", outputs.size());
  std::vector<int64_t> sendCounts, recvCounts;
  for (int p = 0; p < size_; ++p) {
    checkSameKind(op, rank_, inputs[0], inputs[p], "an input");
    checkSameKind(op, rank_, inputs[0], outputs[p], "an output");
    sendCounts.push_back(inputs[p].numel());
    recvCounts.push_back(outputs[p].numel());
  }
  mpi::transportType(inputs[0].scalar_type(), op, rank_);
  auto bufs = buffersFor(inputs[0]);
  const size_t in = bufs->add(inputs, Access::Read);
  const size_t out = bufs->add(outputs, Access::Write);
  return enqueue(c10d::OpType::ALLTOALL, op, outputs, inputs, opts.timeout, opts.asyncOp, bufs,
                 [this, op, in, out, sendCounts, recvCounts](OpBuffers& b) {
                   mpi::alltoallv(comm_, op, b.mpi(in), sendCounts, b.mpi(out), recvCounts);
                 });
}

// ---------------------------------------------------------------------------------------------
// Point-to-point: posted in issue order (on the caller when nothing is ahead, else on the
// worker), completed as MPI finishes them (found by the worker's polling or a waiting caller).

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::enqueueP2P(c10d::OpType type, const char* op,
                                                              at::Tensor tensor, int peer,
                                                              int tag) {
  checkTensor(op, rank_, tensor);
  if (peer != MPI_ANY_SOURCE) {
    checkRank(op, rank_, size_, peer, "peer");
    MPIGPU_CHECK_VALUE(peer != rank_, op, rank_, "sending to or receiving from yourself is not "
                       "supported; copy the tensor instead");
  }
  // Read once at MPI init (MPI_Comm_get_attr per op would cost a call on every send).
  const int tagUpperBound = mpi::ensureInitialized().tagUpperBound;
  MPIGPU_CHECK_VALUE(tag >= 0 && tag <= tagUpperBound, op, rank_, "tag ", tag,
                     " is outside MPI's range [0, ", tagUpperBound, "]");
  mpi::transportType(tensor.scalar_type(), op, rank_);
  const auto engine = currentEngine(op);
  const bool sending = type == c10d::OpType::SEND;
  auto bufs = buffersFor(tensor);
  // Not elementwise: the request outlives the task, so its buffer is staged whole.
  bufs->add(tensor, sending ? Access::Read : Access::Write);
  bufs->issued();
  const uint64_t seq = ++p2pSeq_;
  auto work = c10::make_intrusive<WorkMPIGPU>(
      rank_, type, op, seq, std::vector<at::Tensor>{tensor}, timeout(), profilingTitle(type),
      std::optional<std::vector<at::Tensor>>(std::vector<at::Tensor>{tensor}),
      std::vector<std::shared_ptr<OpBuffers>>{bufs});
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    if (coalescing_) coalesced_.push_back(work);
  }
  auto post = [this, engine = engine.get(), op, bufs, peer, tag, sending, work] {
    std::vector<MPI_Request> reqs;
    {
      auto onCommStream = bufs->enter();
      bufs->stageIn();
      at::Tensor& b = bufs->mpi(0);
      reqs = sending ? mpi::isend(comm_, op, b, peer, tag) : mpi::irecv(comm_, op, b, peer, tag);
    }
    WorkMPIGPU* raw = work.get();  // the pending entry owns `work`
    engine->addPending(std::move(reqs), work, [bufs, raw](const MPI_Status& status) {
      if (status.MPI_ERROR == MPI_SUCCESS) {  // on an error: release only, copy nothing back
        raw->setSourceRank(status.MPI_SOURCE);
        auto onCommStream = bufs->enter();
        bufs->stageOut();
      }
      bufs->release();
    });
    return false;
  };
  // Host tensors: posted on the calling thread when nothing is ahead of it, and wait() tests
  // for the reply itself, so a send/recv pays no thread hand-off or wake-up on either end.
  if (bufs->kind() == paths::PathKind::Cpu && tensor.nbytes() <= static_cast<size_t>(config_.inlineBytes)) {
    work->setProgressDriver(std::weak_ptr<ProgressDriver>(engine));
    if (engine->tryPostInline(work, post)) return work;
  }
  engine->submit(work, std::move(post));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::send(std::vector<at::Tensor>& tensors,
                                                        int dstRank, int tag) {
  checkSingle("send", rank_, tensors);
  return enqueueP2P(c10d::OpType::SEND, "send", tensors[0], dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::recv(std::vector<at::Tensor>& tensors,
                                                        int srcRank, int tag) {
  checkSingle("recv", rank_, tensors);
  return enqueueP2P(c10d::OpType::RECV, "recv", tensors[0], srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                 int tag) {
  checkSingle("recv", rank_, tensors);
  return enqueueP2P(c10d::OpType::RECVANYSOURCE, "recv", tensors[0], MPI_ANY_SOURCE, tag);
}

// ---------------------------------------------------------------------------------------------
// Synchronisation

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::barrier(const c10d::BarrierOptions& opts) {
  const char* op = "barrier";
  return enqueue(c10d::OpType::BARRIER, op, {}, {}, opts.timeout, opts.asyncOp, paths_->create(at::kCPU),
                 [this, op](OpBuffers&) { mpi::barrier(comm_, op); });
}

} // namespace mpigpu
