#include "ProcessGroupMPIGPU.hpp"

#include <c10/util/Logging.h>
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include "ops/ArgChecks.hpp"
#include "ops/Desync.hpp"
#include "core/Errors.hpp"
#include "ops/Fusion.hpp"
#include "Profiling.hpp"
#include "ops/Sparse.hpp"
#include "mpi/Check.hpp"
#include "mpi/Env.hpp"
#include "mpi/Types.hpp"
#include "engine/FlightRecorder.hpp"
#include "engine/Watchdog.hpp"

namespace mpigpu {

using paths::Access;
using paths::OpBuffers;
using std::chrono::milliseconds;

milliseconds ProcessGroupMPIGPU::effectiveTimeout(milliseconds optTimeout) const {
  return optTimeout == c10d::kUnsetTimeout ? timeout() : optTimeout;
}

c10d::ErrorType ProcessGroupMPIGPU::getError() {
  std::lock_guard<std::mutex> lock(engineMutex_);
  // abort() takes the engine and leaves the communicators (an op stuck in MPI may still use
  // them); a clean shutdown() frees them before it lets the engine go.
  return !engine_ && comm_.handle != MPI_COMM_NULL ? c10d::ErrorType::COMM_ERROR
                                                   : c10d::ErrorType::SUCCESS;
}

std::pair<c10::intrusive_ptr<WorkMPIGPU>, bool> ProcessGroupMPIGPU::newWork(
    c10d::OpType type, const char* op, uint64_t seq, std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> inputs, milliseconds timeout, const std::shared_ptr<OpBuffers>& bufs,
    bool asyncOp, int peer) {
  const bool p2p = c10d::isP2POp(type);
  const char* title = profilingTitle(type);
  const bool profiling = profilerActive();
  recordParamComms({&groupName_, &getGroupDesc(), rank_, size_, &globalRanks_, op, seq, p2p,
                    asyncOp, &inputs, &outputs, profiling});
  // (the title and inputs go to torch's Work only for a profiler's event: no copy otherwise)
  auto work = c10::make_intrusive<WorkMPIGPU>(
      rank_, type, op, seq, std::move(outputs), timeout, profiling ? title : nullptr,
      profiling ? std::optional<std::vector<at::Tensor>>(inputs) : std::nullopt,
      WorkMPIGPU::Buffers{bufs});
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
  work->setFlightRecord(
      fr::Recorder::get().record(recorded, inputs, work->outputs(), work->createdAt()));
  work->setContext(groupName_, globalRanks_[rank_]);
  if (config_.debug) {
    LOG(INFO) << logPrefix() << op << ": " << (p2p ? "p2p op #" : "collective #") << seq
              << " queued (" << bufs->pathName() << " path)";
  }
  // Coalescing blocks are rare: the lock only inside one (a block opens and closes on the
  // issuing thread, before and after its ops).
  if (!coalescing_.load(std::memory_order_acquire)) return {work, false};
  std::lock_guard<std::mutex> lock(coalesceMutex_);
  if (coalescing_) coalesced_.push_back(work);
  return {work, coalescing_.load()};
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::enqueue(ops::Plan plan) {
  if (C10_UNLIKELY(estimate_.active())) {  // planned, not run
    estimate_.add(group_, plan);
    return estimatedWork(plan.type, plan.op, std::move(plan.outputs));
  }
  const char* op = plan.op;
  const c10d::OpType type = plan.type;
  const bool asyncOp = plan.asyncOp;
  const milliseconds optTimeout = plan.timeout;
  auto bufs = std::move(plan.bufs);
  auto body = std::move(plan.body);
  std::vector<at::Tensor> outputs = std::move(plan.outputs);
  std::vector<at::Tensor> inputs = std::move(plan.inputs);
  const auto engine = currentEngine(op);
  bufs->issued(op, rank_);  // before the op takes a number: it may refuse
  // What every rank must agree on (ops/Desync.hpp: compared before this op, or in a digest).
  const Fingerprint fp = desync_.enabled()
                             ? fingerprintOf(type, inputs, outputs, plan.root, plan.redop)
                             : Fingerprint{};
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
  auto task = [this, engine = engine.get(), watched, fp, bufs = std::move(bufs),
               body = std::move(body)]() mutable {
    watched.onCaller = !engine->onWorkerThread();
    const char* name = watched.name;
    const uint64_t seq = watched.seq;
    Watchdog::Scope watch(std::move(watched));
    desync_.onCollective(comm_, groupName_, name, seq, fp);
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
      engine->tryInline(work, task, Engine::Inline::Collective)) {
    work->holdOutputsWeakly();  // finished: torch's wait() and result() need no strong hold
    return work;
  }
  engine->submit(work, Engine::Task(std::move(task)));
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
// The collectives: each is checked and planned in ops/ (ops/OpPlan.hpp), then enqueued here.

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  MPIGPU_CHECK_VALUE(!tensors.empty(), "allreduce", rank_, "got an empty tensor list");
  if (tensors[0].defined() && tensors[0].is_sparse()) return allreduce_sparse(tensors, opts);
  return enqueue(ops::allreduce(group_, tensors, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const BlockCloser closer(*this, "allreduce_coalesced");
  return allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return enqueue(ops::allreduceSparse(group_, tensors, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  return enqueue(ops::reduce(group_, tensors, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return enqueue(ops::reduceScatter(group_, outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const BlockCloser closer(*this, "reduce_scatter_tensor");
  return enqueue(ops::reduceScatterTensors(group_, outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  return enqueue(ops::broadcast(group_, tensors, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return enqueue(ops::allgather(group_, outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return allgather_into_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const BlockCloser closer(*this, "all_gather_into_tensor");
  return enqueue(ops::allgatherTensors(group_, outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return enqueue(ops::allgatherCoalesced(group_, outputLists, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return enqueue(ops::gather(group_, outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return enqueue(ops::scatter(group_, outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  return enqueue(
      ops::alltoallSingle(group_, output, input, outputSplitSizes, inputSplitSizes, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  return enqueue(ops::alltoall(group_, outputs, inputs, opts));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(ops::barrier(group_, opts));
}

// torch's _time_estimator (ops/TimeEstimate.hpp).
void ProcessGroupMPIGPU::startTimeEstimate() {
  currentEngine("_start_time_estimate");  // a destroyed or aborted group says so
  estimate_.start(logPrefix());
}

float ProcessGroupMPIGPU::endTimeEstimate() { return estimate_.end(group_); }

c10::intrusive_ptr<c10d::Work> ProcessGroupMPIGPU::estimatedWork(c10d::OpType type, const char* op,
                                                                 std::vector<at::Tensor> outputs) {
  // Not numbered, recorded or watched: nothing runs, and no rank's sequence may move.
  auto work = c10::make_intrusive<WorkMPIGPU>(rank_, type, op, /*seq=*/0, std::move(outputs),
                                              milliseconds(0), nullptr, std::nullopt);
  work->markCompleted();
  return work;
}

// ---------------------------------------------------------------------------------------------
// Point-to-point: posted in issue order (on the caller when nothing is ahead, else on the
// worker), completed as MPI finishes them (found by the worker's polling or a waiting caller).

namespace {

// A message shorter than its receive leaves the tensor partly written, and MPI calls that a
// success: compare what arrived (the first piece, where a huge tensor goes in pieces) with what
// the receive expects, and fail it instead, naming the peer and both sizes.
void checkReceivedAll(const char* op, int rank, int64_t maxCount, const MPI_Status& status,
                      const at::Tensor& buf, paths::OpBuffers& bufs) {
  int arrived = 0;
  MPI_Get_count(&status, MPI_BYTE, &arrived);
  const int64_t expected =
      std::min<int64_t>(buf.numel(), maxCount) * static_cast<int64_t>(buf.element_size());
  if (arrived == expected) return;
  bufs.release();  // nothing is copied back
  MPIGPU_THROW_BACKEND(op, rank, "the message from rank ", status.MPI_SOURCE, " (tag ",
                       status.MPI_TAG, ") held ", arrived, " bytes, but this receive expects ",
                       expected, " (", buf.numel(), " elements of ", buf.scalar_type(),
                       "); the tensor's contents are undefined (MPI may have written what "
                       "arrived). A send and its receive must match in size and dtype");
}

// What runs when a send or receive completes: the received bytes checked and staged out.
Engine::Then completion(const char* op, int rank, int64_t maxCount, bool sending,
                        std::shared_ptr<paths::OpBuffers> bufs, WorkMPIGPU* raw,
                        std::shared_ptr<Watchdog::Scope> watch) {
  // `watch` rides along: the pending entry owns `then`, so the op stays watched while pending
  return [op, rank, maxCount, sending, bufs, raw, watch](const MPI_Status& status) {
    if (status.MPI_ERROR == MPI_SUCCESS) {  // on an error: release only, copy nothing back
      raw->setSourceRank(status.MPI_SOURCE);
      if (!sending) checkReceivedAll(op, rank, maxCount, status, bufs->mpi(0), *bufs);
      auto onCommStream = bufs->enter();
      bufs->stageOut();
    }
    bufs->release();
  };
}

}  // namespace

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
  if (C10_UNLIKELY(estimate_.active())) {
    estimate_.addP2P(group_, type, tensor);
    return estimatedWork(type, op, {tensor});
  }
  const auto engine = currentEngine(op);
  const bool sending = type == c10d::OpType::SEND;
  auto bufs = group_.buffers(tensor);
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
    Engine::Then then = completion(op, rank_, comm_.maxCount, sending, bufs, raw, watch);
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
  engine->submit(work, Engine::Task(std::move(post)));
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

}  // namespace mpigpu
