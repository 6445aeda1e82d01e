#include "ProcessGroupMPIGPU.hpp"

#include <c10/util/Logging.h>
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include "ArgChecks.hpp"
#include "Desync.hpp"
#include "Errors.hpp"
#include "Fusion.hpp"
#include "Profiling.hpp"
#include "Sparse.hpp"
#include "mpi/Check.hpp"
#include "mpi/Env.hpp"
#include "mpi/Types.hpp"
#include "engine/FlightRecorder.hpp"
#include "engine/Watchdog.hpp"

namespace mpigpu {

using paths::Access;
using paths::OpBuffers;
using std::chrono::milliseconds;

algo::Facts ProcessGroupMPIGPU::factsOf(algo::OpKind kind,
                                        const std::vector<at::Tensor>& tensors) const {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  const bool nodeSuits = node_ && node_->suits();
  const bool onSharedDevice = nodeSuits && node_->leaderOnSharedDevice() && !tensors[0].is_cpu();
  return {kind,        bytes,         tensors[0].scalar_type(), size_, groupHasGpu_, nodeSuits,
          spansNodes_, onSharedDevice};
}

// The node algorithm in device slots: it settles before every barrier and MPI call, and its
// fallback (the ring) through links that do (OpBuffers::deferStartWait).
bool ProcessGroupMPIGPU::onDeviceSlots(const algo::Algorithm* a) const {
  return a == &algo::node() && node_ && node_->onDevice();
}

const algo::Algorithm* ProcessGroupMPIGPU::chooseAlgo(
    algo::OpKind kind, const std::vector<at::Tensor>& tensors) const {
  return algo::choose(policy_, config_, factsOf(kind, tensors));
}

std::vector<std::vector<size_t>> ProcessGroupMPIGPU::fusedBuckets(
    const std::vector<at::Tensor>& tensors) const {
  return fusionBuckets(tensors, config_.fusionBytes, fuseBelow(config_, groupHasGpu_));
}

void ProcessGroupMPIGPU::withAlgorithm(const OpBuffers& bufs, const char* op, const at::Tensor& buf,
                                       const mpi::Reduction& red,
                                       const std::function<void(algo::Context&)>& fn) const {
  auto link = bufs.link(algoComm_, op, buf.numel() * static_cast<int64_t>(buf.element_size()));
  auto reducer = bufs.reducer(red.kind);
  const int64_t piece = std::clamp<int64_t>(
      config_.algoPieceBytes / static_cast<int64_t>(buf.element_size()), 1, algoComm_.maxCount);
  algo::Context ctx{*link, *reducer, red, piece, node_.get()};
  fn(ctx);
}

void ProcessGroupMPIGPU::gatherAll(const OpBuffers& bufs, const char* op,
                                   const algo::Algorithm* mover, const at::Tensor& in,
                                   at::Tensor& out) const {
  bool moved = false;
  if (mover != nullptr) {
    withAlgorithm(bufs, op, in, mpi::Reduction{},
                  [&](algo::Context& c) { moved = algo::allgather(c, *mover, in, out); });
  }
  if (!moved) mpi::allgather(comm_, op, in, out);
}

void ProcessGroupMPIGPU::broadcastFrom(const OpBuffers& bufs, const char* op,
                                       const algo::Algorithm* mover, at::Tensor& buf,
                                       int root) const {
  bool moved = false;
  if (mover != nullptr) {
    withAlgorithm(bufs, op, buf, mpi::Reduction{},
                  [&](algo::Context& c) { moved = algo::broadcast(c, *mover, buf, root); });
  }
  if (!moved) mpi::broadcast(comm_, op, buf, root);
}

std::vector<int64_t> ProcessGroupMPIGPU::blockCounts(const char* op,
                                                     const std::vector<at::Tensor>& blocks,
                                                     const at::Tensor& mine, const char* block,
                                                     const char* own) const {
  std::vector<int64_t> counts;
  const std::string what = std::string("an ") + block;
  for (const auto& t : blocks) {
    checkSameKind(op, rank_, mine, t, what.c_str());
    counts.push_back(t.numel());
  }
  MPIGPU_CHECK_VALUE(counts[rank_] == mine.numel(), op, rank_, block, " ", rank_,
                     " (this rank's own block) has ", counts[rank_], " elements but the ", own,
                     " has ", mine.numel(), "; ", block, " r must have the size of rank r's ", own);
  return counts;
}

milliseconds ProcessGroupMPIGPU::effectiveTimeout(milliseconds optTimeout) const {
  return optTimeout == c10d::kUnsetTimeout ? timeout() : optTimeout;
}

std::pair<c10::intrusive_ptr<WorkMPIGPU>, bool> ProcessGroupMPIGPU::newWork(
    c10d::OpType type, const char* op, uint64_t seq, std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs, milliseconds timeout, const std::shared_ptr<OpBuffers>& bufs,
    bool asyncOp, int peer) {
  const bool p2p = c10d::isP2POp(type);
  const char* title = profilingTitle(type);
  recordParamComms({&groupName_, &getGroupDesc(), rank_, size_, &globalRanks_, op, seq, p2p,
                    asyncOp, &inputs, &outputs});
  fr::Recorder::Op recorded{flightRecorderId_,
                            &getGroupDesc(),
                            p2p ? collectives_->load() : seq,
                            p2p ? seq : p2pSeq_.load(),
                            title,
                            p2p,
                            rank_,
                            peer,
                            type == c10d::OpType::SEND,
                            timeout};
  const uint64_t flightRecord = fr::Recorder::get().record(recorded, inputs, outputs);
  auto work = c10::make_intrusive<WorkMPIGPU>(rank_, type, op, seq, std::move(outputs), timeout,
                                              title, std::optional<std::vector<at::Tensor>>(inputs),
                                              std::vector<std::shared_ptr<OpBuffers>>{bufs});
  work->setContext(groupName_, globalRanks_[rank_]);
  work->setFlightRecord(flightRecord);
  if (config_.debug) {
    LOG(INFO) << logPrefix() << op << ": " << (p2p ? "p2p op #" : "collective #") << seq
              << " queued (" << bufs->pathName() << " path)";
  }
  std::lock_guard<std::mutex> lock(coalesceMutex_);
  if (coalescing_) coalesced_.push_back(work);
  return {work, coalescing_};
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::enqueue(c10d::OpType type, const char* op,
                                                           std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> inputs,
                                                           milliseconds optTimeout, bool asyncOp,
                                                           std::shared_ptr<OpBuffers> bufs,
                                                           Body body, int root) {
  const auto engine = currentEngine(op);
  bufs->issued(op, rank_);  // before the op takes a number: it may refuse
  // What every rank must agree on (compared before the op with TORCH_MPIGPU_DESYNC_CHECK=1).
  const Fingerprint fp =
      config_.desyncCheck ? fingerprintOf(type, inputs, outputs, root) : Fingerprint{};
  // The group's collective number: the same on every rank (point-to-point ops have their own).
  const uint64_t seq = ++*collectives_;
  auto built = newWork(type, op, seq, std::move(outputs), std::move(inputs),
                       effectiveTimeout(optTimeout), bufs, asyncOp);
  const auto work = built.first;
  const bool coalescing = built.second;
  const int64_t bytes = bufs->bytes();
  const bool host = bufs->onCallerMemory();
  const bool small = bytes <= config_.inlineBytes;
  Watchdog::Op watched{groupName_, op,
                       seq,        rank_,
                       bytes,      effectiveTimeout(optTimeout),
                       false,      config_.abortOnTimeout};
  Engine::Task task = [this, engine = engine.get(), watched, fp, bufs = std::move(bufs),
                       body = std::move(body)]() mutable {
    const bool onCaller = !engine->onWorkerThread();
    watched.onCaller = onCaller;
    const char* name = watched.name;
    const uint64_t seq = watched.seq;
    Watchdog::Scope watch(std::move(watched));
    if (config_.desyncCheck) checkSameCollective(comm_, groupName_, name, seq, fp);
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
  if (!asyncOp && host && small && !coalescing &&
      engine->tryInline(work, task, Engine::Inline::Collective))
    return work;
  engine->submit(work, std::move(task));
  return work;
}

void ProcessGroupMPIGPU::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalesceMutex_);
  if (coalescing_) {
    LOG(WARNING) << logPrefix() << "start_coalescing: the previous coalescing block was never "
                 << "ended (torch ends one only when its body returns; something in it raised), "
                 << "so its " << coalesced_.size() << " op(s) ran without a combined Work; "
                 << "starting a new block";
  }
  coalescing_ = true;
  coalesced_.clear();
}

void ProcessGroupMPIGPU::closeBlockAfterError(const char* op) noexcept {
  std::lock_guard<std::mutex> lock(coalesceMutex_);
  if (!coalescing_) return;
  coalescing_ = false;
  // (they run as issued; only their combined Work goes)
  coalesced_.clear();
  LOG(INFO) << logPrefix() << op << " raised inside a coalescing block: the block is closed";
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::endCoalescing() {
  std::vector<c10::intrusive_ptr<WorkMPIGPU>> parts;
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    MPIGPU_CHECK_VALUE(coalescing_, "end_coalescing", rank_,
                       "coalescing was not started, or an op in the block raised and closed it "
                       "(that op's error says why)");
    coalescing_ = false;
    parts.swap(coalesced_);
  }
  return combineWorks(rank_, "coalesced", collectives_->load(), parts, timeout());
}

// ---------------------------------------------------------------------------------------------
// Reductions

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  MPIGPU_CHECK_VALUE(!tensors.empty(), op, rank_, "got an empty tensor list");
  if (tensors[0].defined() && tensors[0].is_sparse()) return allreduce_sparse(tensors, opts);
  for (const auto& t : tensors) checkSameDevice(op, rank_, tensors[0], t, "a tensor");
  struct Bucket {
    size_t slot;
    mpi::Reduction red;
    const algo::Algorithm* algo;  // null: MPI's own
  };
  // The whole op decides whose collectives it uses (its buffers depend on it), each bucket which
  // of our algorithms.
  const bool ours = chooseAlgo(algo::OpKind::Allreduce, tensors) != nullptr;
  auto bufs = reduceBuffersFor(tensors[0], ours);
  std::vector<Bucket> buckets;
  for (const auto& idx : fusedBuckets(tensors)) {
    auto red = mpi::resolveReduction(opts.reduceOp, tensors[idx[0]].scalar_type(), op, rank_);
    const algo::Algorithm* a = nullptr;
    if (ours)
      a = &algo::chooseOurs(policy_, config_, factsOf(algo::OpKind::Allreduce, pick(tensors, idx)));
    buckets.push_back({bufs->add(pick(tensors, idx), Access::ReadWrite, /*elementwise=*/true),
                       std::move(red), a});
  }
  if (std::all_of(buckets.begin(), buckets.end(),
                  [&](const Bucket& k) { return onDeviceSlots(k.algo); }))
    bufs->deferStartWait();
  return enqueue(c10d::OpType::ALLREDUCE, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
                 [this, op, buckets](OpBuffers& b) {
                   for (const auto& k : buckets) {
                     b.run(k.slot, [&](at::Tensor& t) {
                       if (k.algo == nullptr) {
                         mpi::allreduceInPlace(comm_, op, t, k.red);
                         return;
                       }
                       withAlgorithm(b, op, t, k.red,
                                     [&](algo::Context& c) { algo::allreduce(c, *k.algo, t); });
                     });
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const BlockCloser closer(*this, "allreduce_coalesced");
  return allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  sparse::checkAllreduce(op, rank_, tensors, opts.reduceOp);
  const bool average = opts.reduceOp == c10d::ReduceOp::AVG;
  // No slots: the device's buffers only order the op after the caller's stream, run it on the
  // op's stream and order the caller's stream after it, as for dense tensors.
  return enqueue(c10d::OpType::ALLREDUCE, op, tensors, tensors, opts.timeout, opts.asyncOp,
                 paths_->create(tensors[0].device()),
                 [this, op, tensors, average](OpBuffers&) mutable {
                   for (auto& t : tensors) sparse::allreduceInPlace(comm_, op, t, average);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  checkSingle(op, rank_, tensors);
  checkRank(op, rank_, size_, opts.rootRank, "root");
  MPIGPU_CHECK_VALUE(opts.rootTensor == 0, op, rank_, "rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  auto red = mpi::resolveReduction(opts.reduceOp, tensors[0].scalar_type(), op, rank_);
  const algo::Algorithm* ours = chooseAlgo(algo::OpKind::Reduce, tensors);
  auto bufs = reduceBuffersFor(tensors[0], ours != nullptr);
  // Only the root's tensor changes.
  const size_t slot = bufs->add(tensors[0], rank_ == root ? Access::ReadWrite : Access::Read,
                                /*elementwise=*/true);
  return enqueue(
      c10d::OpType::REDUCE, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
      [this, op, slot, red, root, ours](OpBuffers& b) {
        b.run(slot, [&](at::Tensor& t) {
          if (!ours) {
            mpi::reduce(comm_, op, t, t, red, root);
            return;
          }
          withAlgorithm(b, op, t, red, [&](algo::Context& c) { algo::reduce(c, *ours, t, root); });
        });
      },
      root);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  checkSingle(op, rank_, outputs);
  MPIGPU_CHECK_VALUE(inputs.size() == 1, op, rank_, "expects one input list, got ", inputs.size());
  MPIGPU_CHECK_VALUE(static_cast<int>(inputs[0].size()) == size_, op, rank_, "input list has ",
                     inputs[0].size(), " tensors, the group has ", size_, " ranks");
  // Input r is reduced into rank r's output. Blocks of different sizes (as NCCL allows) go to
  // MPI_Reduce_scatter with its counts (our algorithms reduce equal blocks only).
  const std::vector<int64_t> counts = blockCounts(op, inputs[0], outputs[0], "input", "output");
  const bool even =
      std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == outputs[0].numel(); });
  auto red = mpi::resolveReduction(opts.reduceOp, outputs[0].scalar_type(), op, rank_);
  const algo::Algorithm* ours = even ? chooseAlgo(algo::OpKind::ReduceScatter, inputs[0]) : nullptr;
  auto bufs = reduceBuffersFor(outputs[0], ours != nullptr);
  if (onDeviceSlots(ours)) bufs->deferStartWait();
  const size_t in = bufs->add(inputs[0], Access::Read);
  const size_t out = bufs->add(outputs[0], Access::Write);
  return enqueue(c10d::OpType::REDUCE_SCATTER, op, outputs, inputs[0], opts.timeout, opts.asyncOp,
                 bufs, [this, op, in, out, red, ours, even, counts](OpBuffers& b) {
                   if (!even) {
                     mpi::reduceScatterV(comm_, op, b.mpi(in), b.mpi(out), counts, red);
                     return;
                   }
                   if (!ours) {
                     mpi::reduceScatter(comm_, op, b.mpi(in), b.mpi(out), red);
                     return;
                   }
                   withAlgorithm(b, op, b.mpi(in), red, [&](algo::Context& c) {
                     algo::reduceScatter(c, *ours, b.mpi(in), b.mpi(out));
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
  const BlockCloser closer(*this, op);
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
  const algo::Algorithm* ours = chooseAlgo(algo::OpKind::ReduceScatter, inputs);
  auto bufs = reduceBuffersFor(outputs[0], ours != nullptr);
  if (onDeviceSlots(ours)) bufs->deferStartWait();
  std::vector<Bucket> buckets;
  for (const auto& idx : fusedBuckets(outputs)) {
    std::vector<at::Tensor> ins;
    for (size_t i : idx) ins.push_back(inputs[i].reshape({size_, -1}));
    auto red = mpi::resolveReduction(opts.reduceOp, outputs[idx[0]].scalar_type(), op, rank_);
    // A single input is rank-major already: MPI reads it as it is.
    buckets.push_back(
        {bufs->add(idx.size() == 1 ? pick(inputs, idx) : rankMajorRows(ins, size_), Access::Read),
         bufs->add(pick(outputs, idx), Access::Write), std::move(red)});
  }
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, op, outputs, inputs, opts.timeout,
                 opts.asyncOp, bufs, [this, op, buckets, ours](OpBuffers& b) {
                   for (const auto& k : buckets) {
                     if (!ours) {
                       mpi::reduceScatter(comm_, op, b.mpi(k.in), b.mpi(k.out), k.red);
                       continue;
                     }
                     withAlgorithm(b, op, b.mpi(k.in), k.red, [&](algo::Context& c) {
                       algo::reduceScatter(c, *ours, b.mpi(k.in), b.mpi(k.out));
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
  const algo::Algorithm* mover = chooseAlgo(algo::OpKind::Broadcast, tensors);
  auto bufs = buffersFor(tensors[0]);
  const size_t slot = bufs->add(tensors[0], rank_ == root ? Access::Read : Access::Write,
                                /*elementwise=*/true);
  return enqueue(
      c10d::OpType::BROADCAST, op, tensors, tensors, opts.timeout, opts.asyncOp, bufs,
      [this, op, slot, root, mover](OpBuffers& b) {
        b.run(slot, [&](at::Tensor& t) { broadcastFrom(b, op, mover, t, root); });
      },
      root);
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
  // Output r holds rank r's input. Torch allows the ranks' inputs to differ in size: then the
  // blocks travel by MPI_Allgatherv (our algorithms move equal blocks only).
  const std::vector<int64_t> counts = blockCounts(op, outputs[0], inputs[0], "output", "input");
  const bool even =
      std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == inputs[0].numel(); });
  mpi::transportType(inputs[0].scalar_type(), op, rank_);
  const algo::Algorithm* mover = even ? chooseAlgo(algo::OpKind::Allgather, outputs[0]) : nullptr;
  auto bufs = buffersFor(inputs[0]);
  const size_t in = bufs->add(inputs[0], Access::Read);
  const size_t out = bufs->add(outputs[0], Access::Write);
  return enqueue(c10d::OpType::ALLGATHER, op, outputs[0], inputs, opts.timeout, opts.asyncOp, bufs,
                 [this, op, in, out, mover, even, counts](OpBuffers& b) {
                   if (even)
                     gatherAll(b, op, mover, b.mpi(in), b.mpi(out));
                   else
                     mpi::allgatherv(comm_, op, b.mpi(in), b.mpi(out), counts);
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
  const BlockCloser closer(*this, op);
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
  const algo::Algorithm* mover = chooseAlgo(algo::OpKind::Allgather, outputs);
  auto bufs = buffersFor(inputs[0]);
  std::vector<Bucket> buckets;
  auto addBucket = [&](const std::vector<size_t>& idx) {
    std::vector<at::Tensor> outs = pick(outputs, idx);
    buckets.push_back(
        {bufs->add(pick(inputs, idx), Access::Read),
         bufs->add(idx.size() == 1 ? outs : rankMajorRows(outs, size_), Access::Write)});
  };
  for (const auto& idx : fusedBuckets(inputs)) {
    std::vector<size_t> fused;
    for (size_t i : idx) {
      if (outputs[i].is_contiguous())
        fused.push_back(i);
      else
        addBucket({i});
    }
    if (!fused.empty()) addBucket(fused);
  }
  return enqueue(c10d::OpType::_ALLGATHER_BASE, op, outputs, inputs, opts.timeout, opts.asyncOp,
                 bufs, [this, op, buckets, mover](OpBuffers& b) {
                   for (const auto& k : buckets) gatherAll(b, op, mover, b.mpi(k.in), b.mpi(k.out));
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
  const algo::Algorithm* mover = chooseAlgo(algo::OpKind::Allgather, allOuts);
  auto bufs = buffersFor(inputs[0]);
  const size_t in = bufs->add(inputs, Access::Read);
  const size_t out = bufs->add(allOuts, Access::Write);  // rank-major, input order within a rank
  return enqueue(
      c10d::OpType::ALLGATHER_COALESCED, op, allOuts, inputs, opts.timeout, opts.asyncOp, bufs,
      [this, op, in, out, mover](OpBuffers& b) { gatherAll(b, op, mover, b.mpi(in), b.mpi(out)); });
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
      MPIGPU_CHECK_VALUE(t.numel() == inputs[0].numel(), op, rank_,
                         "every output must have the "
                         "input's ",
                         inputs[0].numel(), " elements, one has ", t.numel());
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
  return enqueue(
      c10d::OpType::GATHER, op, outs, inputs, opts.timeout, opts.asyncOp, bufs,
      [this, op, in, out, root, isRoot](OpBuffers& b) {
        mpi::gather(comm_, op, b.mpi(in), isRoot ? &b.mpi(out) : nullptr, root);
      },
      root);
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
    MPIGPU_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, op, rank_,
                       "the root needs one input list of ", size_, " tensors");
    for (const auto& t : inputs[0]) {
      checkSameKind(op, rank_, outputs[0], t, "an input");
      MPIGPU_CHECK_VALUE(t.numel() == outputs[0].numel(), op, rank_,
                         "every input must have the "
                         "output's ",
                         outputs[0].numel(), " elements, one has ", t.numel());
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
  return enqueue(
      c10d::OpType::SCATTER, op, outputs, ins, opts.timeout, opts.asyncOp, bufs,
      [this, op, in, out, root, isRoot](OpBuffers& b) {
        mpi::scatter(comm_, op, isRoot ? &b.mpi(in) : nullptr, b.mpi(out), root);
      },
      root);
}

// What a rank sends itself it receives from itself: the one pair of an all_to_all a rank can check
// alone (the own block is copied locally, not through MPI, which would have caught it).
void ProcessGroupMPIGPU::checkOwnBlock(const char* op, const std::vector<int64_t>& sendCounts,
                                       const std::vector<int64_t>& recvCounts) const {
  MPIGPU_CHECK_VALUE(sendCounts[rank_] == recvCounts[rank_], op, rank_, "sends itself ",
                     sendCounts[rank_], " elements but receives ", recvCounts[rank_],
                     " from itself; input and output split sizes must agree at index ", rank_);
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
                         " elements, which do not divide evenly across ", size_,
                         " ranks; give "
                         "split sizes");
      std::fill(c.begin(), c.end(), t.numel() / size_);
      return c;
    }
    MPIGPU_CHECK_VALUE(static_cast<int>(splits.size()) == size_, op, rank_, what,
                       " split sizes "
                       "have ",
                       splits.size(), " entries, the group has ", size_, " ranks");
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
  checkOwnBlock(op, sendCounts, recvCounts);
  // Without split sizes every rank sends the same counts (torch requires equal sizes then).
  const bool uniform =
      inputSplitSizes.empty() && outputSplitSizes.empty() && input.numel() == output.numel();
  auto bufs = buffersFor(input);
  const size_t in = bufs->add(input, Access::Read);
  const size_t out = bufs->add(output, Access::Write);
  return enqueue(c10d::OpType::ALLTOALL_BASE, op, {output}, {input}, opts.timeout, opts.asyncOp,
                 bufs, [this, op, in, out, sendCounts, recvCounts, uniform](OpBuffers& b) {
                   mpi::alltoallv(comm_, op, b.mpi(in), sendCounts, b.mpi(out), recvCounts, uniform,
                                  !groupHasGpu_);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  MPIGPU_CHECK_VALUE(
      static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_, op,
      rank_, "needs one input and one output tensor per rank (", size_, "), got ", inputs.size(),
      " and ", outputs.size());
  std::vector<int64_t> sendCounts, recvCounts;
  for (int p = 0; p < size_; ++p) {
    checkSameKind(op, rank_, inputs[0], inputs[p], "an input");
    checkSameKind(op, rank_, inputs[0], outputs[p], "an output");
    sendCounts.push_back(inputs[p].numel());
    recvCounts.push_back(outputs[p].numel());
  }
  checkOwnBlock(op, sendCounts, recvCounts);
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

void ProcessGroupMPIGPU::checkP2P(const char* op, const at::Tensor& tensor, int peer,
                                  int tag) const {
  checkTensor(op, rank_, tensor);
  if (peer != MPI_ANY_SOURCE) {
    checkRank(op, rank_, size_, peer, "peer");
    MPIGPU_CHECK_VALUE(peer != rank_, op, rank_,
                       "sending to or receiving from yourself is not "
                       "supported; copy the tensor instead");
  }
  // Read once at MPI init (MPI_Comm_get_attr per op would cost a call on every send).
  const int tagUpperBound = mpi::ensureInitialized().tagUpperBound;
  MPIGPU_CHECK_VALUE(tag >= 0 && tag <= tagUpperBound, op, rank_, "tag ", tag,
                     " is outside MPI's range [0, ", tagUpperBound, "]");
  mpi::transportType(tensor.scalar_type(), op, rank_);
  if (peer == MPI_ANY_SOURCE) mpi::checkAnySourceCount(comm_, op, tensor);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::enqueueP2P(c10d::OpType type, const char* op,
                                                              at::Tensor tensor, int peer,
                                                              int tag) {
  checkP2P(op, tensor, peer, tag);
  const auto engine = currentEngine(op);
  const bool sending = type == c10d::OpType::SEND;
  auto bufs = buffersFor(tensor);
  // Not elementwise: the request outlives the task, so its buffer is staged whole.
  bufs->add(tensor, sending ? Access::Read : Access::Write);
  bufs->issued(op, rank_);
  const auto work = newWork(type, op, ++p2pSeq_, {tensor}, {tensor}, timeout(), bufs,
                            /*asyncOp=*/true, peer)
                        .first;
  const bool held = !sending && anySource_.probe;
  Watchdog::Op watched{groupName_, op, work->getSequencenumber(), rank_};
  watched.bytes = static_cast<int64_t>(tensor.nbytes());
  watched.abortOnTimeout = config_.abortOnTimeout;
  watched.peer = peer;
  watched.awaited = work->awaited();
  auto post = [this, engine = engine.get(), op, bufs, peer, tag, sending, held, work, watched] {
    WorkMPIGPU* raw = work.get();  // the pending entry owns `work`
    // Watched while the request is pending (the entry owns `then`), for the peer leaving.
    auto watch = peer == MPI_ANY_SOURCE ? nullptr : std::make_shared<Watchdog::Scope>(watched);
    Engine::Then then = [bufs, raw, watch](const MPI_Status& status) {
      if (status.MPI_ERROR == MPI_SUCCESS) {  // on an error: release only, copy nothing back
        raw->setSourceRank(status.MPI_SOURCE);
        auto onCommStream = bufs->enter();
        bufs->stageOut();
      }
      bufs->release();
    };
    std::vector<MPI_Request> reqs;
    {
      auto onCommStream = bufs->enter();
      bufs->stageIn();
      at::Tensor& b = bufs->mpi(0);
      if (!held)
        reqs = sending ? mpi::isend(comm_, op, b, peer, tag) : mpi::irecv(comm_, op, b, peer, tag);
    }
    if (held) {  // matched by probe (mpi/AnySource.hpp): posted by the engine when it can be
      auto receive = [this, op, bufs, peer, tag](MPI_Message* message) {
        at::Tensor& b = bufs->mpi(0);
        return message ? mpi::imrecv(comm_, op, b, message) : mpi::irecv(comm_, op, b, peer, tag);
      };
      engine->addHeldReceive({comm_.handle, peer, tag, std::move(receive)}, work, std::move(then));
      return false;
    }
    engine->addPending(std::move(reqs), work, std::move(then));
    return false;
  };
  // Host tensors: posted on the calling thread when nothing is ahead of it, and wait() tests
  // for the reply itself, so a send/recv pays no thread hand-off or wake-up on either end.
  if (bufs->onCallerMemory() && tensor.nbytes() <= static_cast<size_t>(config_.inlineBytes)) {
    work->setProgressDriver(std::weak_ptr<ProgressDriver>(engine));
    if (engine->tryInline(work, post, Engine::Inline::Post)) return work;
  }
  engine->submit(work, std::move(post));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::send(std::vector<at::Tensor>& tensors,
                                                        int dstRank, int tag) {
  const BlockCloser closer(*this, "send");
  checkSingle("send", rank_, tensors);
  return enqueueP2P(c10d::OpType::SEND, "send", tensors[0], dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::recv(std::vector<at::Tensor>& tensors,
                                                        int srcRank, int tag) {
  const BlockCloser closer(*this, "recv");
  checkSingle("recv", rank_, tensors);
  return enqueueP2P(c10d::OpType::RECV, "recv", tensors[0], srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                 int tag) {
  const BlockCloser closer(*this, "recv");
  checkSingle("recv", rank_, tensors);
  return enqueueP2P(c10d::OpType::RECVANYSOURCE, "recv", tensors[0], MPI_ANY_SOURCE, tag);
}

// ---------------------------------------------------------------------------------------------
// Synchronisation

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::barrier(const c10d::BarrierOptions& opts) {
  const char* op = "barrier";
  return enqueue(c10d::OpType::BARRIER, op, {}, {}, opts.timeout, opts.asyncOp,
                 paths_->create(at::kCPU), [this, op](OpBuffers&) { mpi::barrier(comm_, op); });
}

}  // namespace mpigpu
