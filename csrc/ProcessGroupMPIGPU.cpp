#include "ProcessGroupMPIGPU.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>

#include "Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Env.hpp"
#include "mpi/Types.hpp"
#include "paths/HostPath.hpp"

namespace mpigpu {

using paths::HostBuffer;
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
  MPIGPU_CHECK_TYPE(t.device().type() == ref.device().type(), op, rank, what, " is on ",
                    t.device(), " but the first tensor is on ", ref.device(),
                    "; all tensors of one call must be on one kind of device");
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

std::vector<HostBuffer> inOutBuffers(const std::vector<at::Tensor>& ts) {
  std::vector<HostBuffer> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(paths::forInOut(t));
  return out;
}

// Flat host buffer holding the tensors back to back (list ops are one MPI call).
at::Tensor packed(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape({-1}).to(at::kCPU));
  return at::cat(flat);
}

void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& outs) {
  int64_t off = 0;
  for (const auto& o : outs) {
    o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
    off += o.numel();
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
      timeout_(config_.timeoutSeconds > 0
                   ? milliseconds(static_cast<int64_t>(config_.timeoutSeconds * 1000))
                   : timeout) {
  comm_.rank = rank;
  comm_.size = size;
  comm_.maxCount = config_.maxElementsPerCall;
  engine_ = Engine::create("mpigpu-" + groupName_);
  engine_->runAndWait("new_group", rank, [this] {
    comm_.handle = mpi::createGroupComm(worldRanks_, tagFor(groupName_), rank_);
    int commRank = -1;
    MPI_Comm_rank(comm_.handle, &commRank);
    if (commRank != rank_) {
      MPIGPU_THROW_BACKEND("new_group", rank_, "MPI placed this process at rank ", commRank,
                           " of the new communicator, torch at ", rank_);
    }
  });
  if (config_.debug) {
    std::cerr << opMessage("init", rank_, describe()) << std::endl;
  }
}

ProcessGroupMPIGPU::~ProcessGroupMPIGPU() {
  try {
    releaseCommunicators();
  } catch (...) {
    // Destructors must not throw; at worst the communicators leak until MPI_Finalize.
  }
}

void ProcessGroupMPIGPU::releaseCommunicators() {
  if (!engine_) return;
  if (!engine_->stopped() && !mpi::isFinalized()) {
    engine_->runAndWait("destroy_process_group", rank_, [this] {
      mpi::freeComm(&comm_.handle);
    });
  }
  engine_.reset();
}

void ProcessGroupMPIGPU::shutdown() { releaseCommunicators(); }

std::string ProcessGroupMPIGPU::describe() const {
  const auto& env = mpi::ensureInitialized();
  std::ostringstream s;
  s << "group '" << groupName_ << "' rank " << rank_ << "/" << size_ << " (world ranks";
  for (int r : worldRanks_) s << " " << r;
  s << "), " << env.libraryVersion << ", " << mpi::threadLevelName(env.threadLevel)
    << ", timeout " << timeout_.count() << " ms, max elements per MPI call "
    << config_.maxElementsPerCall << ", CPU tensors: cpu path, other devices: via-cpu path";
  return s.str();
}

milliseconds ProcessGroupMPIGPU::effectiveTimeout(milliseconds optTimeout) const {
  return optTimeout == c10d::kUnsetTimeout ? timeout_ : optTimeout;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::enqueue(c10d::OpType type, const char* op,
                                                           std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> inputs,
                                                           milliseconds optTimeout, Body body) {
  MPIGPU_CHECK_VALUE(engine_ != nullptr, op, rank_,
                     "the process group has been destroyed; create a new one");
  const uint64_t seq = ++seq_;
  auto work = c10::make_intrusive<WorkMPIGPU>(rank_, type, op, seq, std::move(outputs),
                                              effectiveTimeout(optTimeout), op,
                                              std::optional<std::vector<at::Tensor>>(inputs));
  if (config_.debug) {
    std::cerr << opMessage(op, rank_, "op #", seq, " queued") << std::endl;
  }
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    if (coalescing_) coalesced_.push_back(work);
  }
  engine_->submit(work, [body = std::move(body)] {
    body();
    return true;
  });
  return work;
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
  return combineWorks(rank_, "coalesced", seq_.load(), parts, timeout_);
}

// ---------------------------------------------------------------------------------------------
// Reductions

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  MPIGPU_CHECK_VALUE(!tensors.empty(), op, rank_, "got an empty tensor list");
  for (const auto& t : tensors) checkSameDevice(op, rank_, tensors[0], t, "a tensor");
  // One MPI call per dtype: tensors of one dtype are packed into a single buffer.
  std::map<at::ScalarType, std::vector<size_t>> byDtype;
  std::map<at::ScalarType, mpi::Reduction> reductions;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto dt = tensors[i].scalar_type();
    if (!reductions.count(dt)) reductions[dt] = mpi::resolveReduction(opts.reduceOp, dt, op, rank_);
    byDtype[dt].push_back(i);
  }
  auto bufs = inOutBuffers(tensors);
  return enqueue(c10d::OpType::ALLREDUCE, op, tensors, tensors, opts.timeout,
                 [this, op, bufs, byDtype, reductions] {
                   for (const auto& [dt, idx] : byDtype) {
                     const auto& red = reductions.at(dt);
                     if (idx.size() == 1) {
                       at::Tensor b = bufs[idx[0]].mpi;
                       mpi::allreduceInPlace(comm_, op, b, red);
                       continue;
                     }
                     std::vector<at::Tensor> parts;
                     for (size_t i : idx) parts.push_back(bufs[i].mpi);
                     at::Tensor flat = at::cat(parts);
                     mpi::allreduceInPlace(comm_, op, flat, red);
                     unpack(flat, parts);
                   }
                   for (const auto& b : bufs) b.finish();
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
  // Only the root's tensor changes.
  HostBuffer buf = rank_ == root ? paths::forInOut(tensors[0]) : paths::forInput(tensors[0]);
  return enqueue(c10d::OpType::REDUCE, op, tensors, tensors, opts.timeout,
                 [this, op, buf, red, root] {
                   at::Tensor out = buf.mpi;
                   mpi::reduce(comm_, op, buf.mpi, out, red, root);
                   buf.finish();
                 });
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
  at::Tensor in = packed(inputs[0]);
  HostBuffer out = paths::forOutput(outputs[0]);
  return enqueue(c10d::OpType::REDUCE_SCATTER, op, outputs, inputs[0], opts.timeout,
                 [this, op, in, out, red] {
                   at::Tensor o = out.mpi;
                   mpi::reduceScatter(comm_, op, in, o, red);
                   out.finish();
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
  std::vector<HostBuffer> ins, outs;
  std::vector<mpi::Reduction> reds;
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkTensor(op, rank_, outputs[i]);
    checkSameKind(op, rank_, outputs[i], inputs[i], "the input");
    MPIGPU_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_, op, rank_,
                       "input must have group size (", size_, ") x output elements (",
                       outputs[i].numel(), "), got ", inputs[i].numel());
    reds.push_back(mpi::resolveReduction(opts.reduceOp, outputs[i].scalar_type(), op, rank_));
    ins.push_back(paths::forInput(inputs[i]));
    outs.push_back(paths::forOutput(outputs[i]));
  }
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, op, outputs, inputs, opts.timeout,
                 [this, op, ins, outs, reds] {
                   for (size_t i = 0; i < outs.size(); ++i) {
                     at::Tensor o = outs[i].mpi;
                     mpi::reduceScatter(comm_, op, ins[i].mpi, o, reds[i]);
                     outs[i].finish();
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
  HostBuffer buf = rank_ == root ? paths::forInput(tensors[0]) : paths::forOutput(tensors[0]);
  return enqueue(c10d::OpType::BROADCAST, op, tensors, tensors, opts.timeout,
                 [this, op, buf, root] {
                   at::Tensor b = buf.mpi;
                   mpi::broadcast(comm_, op, b, root);
                   buf.finish();
                 });
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
  HostBuffer in = paths::forInput(inputs[0]);
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(c10d::OpType::ALLGATHER, op, outs, inputs, opts.timeout,
                 [this, op, in, outs] {
                   at::Tensor flat = at::empty({in.mpi.numel() * size_}, in.mpi.options());
                   mpi::allgather(comm_, op, in.mpi, flat);
                   unpack(flat, outs);
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
  std::vector<HostBuffer> ins, outs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkTensor(op, rank_, inputs[i]);
    checkSameKind(op, rank_, inputs[i], outputs[i], "the output");
    MPIGPU_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_, op, rank_,
                       "output must have group size (", size_, ") x input elements (",
                       inputs[i].numel(), "), got ", outputs[i].numel());
    mpi::transportType(inputs[i].scalar_type(), op, rank_);
    ins.push_back(paths::forInput(inputs[i]));
    outs.push_back(paths::forOutput(outputs[i]));
  }
  return enqueue(c10d::OpType::_ALLGATHER_BASE, op, outputs, inputs, opts.timeout,
                 [this, op, ins, outs] {
                   for (size_t i = 0; i < outs.size(); ++i) {
                     at::Tensor o = outs[i].mpi;
                     mpi::allgather(comm_, op, ins[i].mpi, o);
                     outs[i].finish();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  MPIGPU_CHECK_VALUE(outputLists.size() == static_cast<size_t>(size_), op, rank_,
                     "expects one output list per rank (", size_, "), got ", outputLists.size());
  std::vector<at::Tensor> flatIns, allOuts;
  for (const auto& t : inputs) checkTensor(op, rank_, t);
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
  MPIGPU_CHECK_VALUE(!inputs.empty(), op, rank_, "got an empty input list");
  for (const auto& t : inputs) {
    MPIGPU_CHECK_TYPE(t.scalar_type() == inputs[0].scalar_type(), op, rank_,
                      "all inputs must share a dtype");
  }
  at::Tensor in = packed(inputs);
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, op, allOuts, inputs, opts.timeout,
                 [this, op, in, allOuts] {
                   at::Tensor flat = at::empty({in.numel() * size_}, in.options());
                   mpi::allgather(comm_, op, in, flat);
                   unpack(flat, allOuts);  // rank-major, input order within a rank
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* op = "gather";
  checkSingle(op, rank_, inputs);
  checkRank(op, rank_, size_, opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
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
  HostBuffer in = paths::forInput(inputs[0]);
  return enqueue(c10d::OpType::GATHER, op, outs, inputs, opts.timeout,
                 [this, op, in, outs, root] {
                   at::Tensor flat;
                   if (rank_ == root) flat = at::empty({in.mpi.numel() * size_}, in.mpi.options());
                   mpi::gather(comm_, op, in.mpi, rank_ == root ? &flat : nullptr, root);
                   if (rank_ == root) unpack(flat, outs);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  checkSingle(op, rank_, outputs);
  checkRank(op, rank_, size_, opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in;
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    MPIGPU_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, op,
                       rank_, "the root needs one input list of ", size_, " tensors");
    for (const auto& t : inputs[0]) {
      checkSameKind(op, rank_, outputs[0], t, "an input");
      MPIGPU_CHECK_VALUE(t.numel() == outputs[0].numel(), op, rank_, "every input must have the "
                         "output's ", outputs[0].numel(), " elements, one has ", t.numel());
    }
    ins = inputs[0];
    in = packed(ins);
  } else {
    MPIGPU_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), op, rank_,
                       "only the root (rank ", root, ") takes input tensors");
  }
  mpi::transportType(outputs[0].scalar_type(), op, rank_);
  HostBuffer out = paths::forOutput(outputs[0]);
  return enqueue(c10d::OpType::SCATTER, op, outputs, ins, opts.timeout,
                 [this, op, in, out, root] {
                   at::Tensor o = out.mpi;
                   mpi::scatter(comm_, op, rank_ == root ? &in : nullptr, o, root);
                   out.finish();
                 });
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
  HostBuffer in = paths::forInput(input), out = paths::forOutput(output);
  return enqueue(c10d::OpType::ALLTOALL_BASE, op, {output}, {input}, opts.timeout,
                 [this, op, in, out, sendCounts, recvCounts] {
                   at::Tensor o = out.mpi;
                   mpi::alltoallv(comm_, op, in.mpi, sendCounts, o, recvCounts);
                   out.finish();
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
  at::Tensor in = packed(inputs);
  std::vector<at::Tensor> outs = outputs;
  const int64_t total = std::accumulate(recvCounts.begin(), recvCounts.end(), int64_t{0});
  return enqueue(c10d::OpType::ALLTOALL, op, outs, inputs, opts.timeout,
                 [this, op, in, outs, sendCounts, recvCounts, total] {
                   at::Tensor flat = at::empty({total}, in.options());
                   mpi::alltoallv(comm_, op, in, sendCounts, flat, recvCounts);
                   unpack(flat, outs);
                 });
}

// ---------------------------------------------------------------------------------------------
// Point-to-point: posted in issue order on the worker, completed as MPI finishes them.

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::enqueueP2P(c10d::OpType type, const char* op,
                                                              at::Tensor tensor, int peer,
                                                              int tag) {
  checkTensor(op, rank_, tensor);
  if (peer != MPI_ANY_SOURCE) {
    checkRank(op, rank_, size_, peer, "peer");
    MPIGPU_CHECK_VALUE(peer != rank_, op, rank_, "sending to or receiving from yourself is not "
                       "supported; copy the tensor instead");
  }
  // Read once at MPI init: no MPI call on the caller's thread (SERIALIZED MPI forbids it).
  const int tagUpperBound = mpi::ensureInitialized().tagUpperBound;
  MPIGPU_CHECK_VALUE(tag >= 0 && tag <= tagUpperBound, op, rank_, "tag ", tag,
                     " is outside MPI's range [0, ", tagUpperBound, "]");
  mpi::transportType(tensor.scalar_type(), op, rank_);
  MPIGPU_CHECK_VALUE(engine_ != nullptr, op, rank_,
                     "the process group has been destroyed; create a new one");
  const bool sending = type == c10d::OpType::SEND;
  HostBuffer buf = sending ? paths::forInput(tensor) : paths::forOutput(tensor);
  const uint64_t seq = ++seq_;
  auto work = c10::make_intrusive<WorkMPIGPU>(
      rank_, type, op, seq, std::vector<at::Tensor>{tensor}, timeout_, op,
      std::optional<std::vector<at::Tensor>>(std::vector<at::Tensor>{tensor}));
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    if (coalescing_) coalesced_.push_back(work);
  }
  engine_->submit(work, [this, op, buf, peer, tag, sending, work] {
    at::Tensor b = buf.mpi;
    auto reqs = sending ? mpi::isend(comm_, op, b, peer, tag) : mpi::irecv(comm_, op, b, peer, tag);
    WorkMPIGPU* raw = work.get();  // the pending entry owns `work`
    engine_->addPending(std::move(reqs), work, [buf, raw](const MPI_Status& status) {
      raw->setSourceRank(status.MPI_SOURCE);
      buf.finish();
    });
    return false;
  });
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
  return enqueue(c10d::OpType::BARRIER, op, {}, {}, opts.timeout,
                 [this, op] { mpi::barrier(comm_, op); });
}

} // namespace mpigpu
