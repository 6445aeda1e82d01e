// The c10d::Backend: checks arguments, prepares buffers for the op's data path and hands the MPI
// work to the engine. The MPI calls themselves are in mpi/Collectives.cpp.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/Config.hpp"
#include "core/TorchCompat.hpp"
#include "algorithms/Algorithms.hpp"
#include "node/Node.hpp"
#include "engine/WorkMPIGPU.hpp"
#include "engine/Engine.hpp"
#include "mpi/AnySource.hpp"
#include "mpi/Collectives.hpp"
#include "ops/Desync.hpp"
#include "ops/OpPlan.hpp"
#include "ops/TimeEstimate.hpp"
#include "paths/Devices.hpp"

namespace mpigpu {

class ProcessGroupMPIGPU : public c10d::Backend {
 public:
  // `globalRanks` are the members' ranks in the default group (= MPI_COMM_WORLD ranks); empty for
  // the default group itself. `made`: a communicator of exactly those ranks, in that order,
  // that the group takes over (split); MPI_COMM_NULL: the group makes its own.
  ProcessGroupMPIGPU(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                     std::vector<int64_t> globalRanks, std::chrono::milliseconds timeout,
                     std::string groupName, MPI_Comm made = MPI_COMM_NULL);
  ~ProcessGroupMPIGPU() override;
  // Makes one (every caller goes through here): a group whose making was given up with its
  // engine's worker still inside MPI (ULFM, a member failed: Engine::runAndWait) is kept until
  // exit, since that call may yet return into it, and its error is thrown.
  static c10::intrusive_ptr<ProcessGroupMPIGPU> make(
      c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::vector<int64_t> globalRanks,
      std::chrono::milliseconds timeout, std::string groupName, MPI_Comm made = MPI_COMM_NULL);

  const std::string getBackendName() const override { return "mpigpu"; }
  bool supportsCoalescing() const override { return true; }
  // torch's _time_estimator: the ops this thread issues in between are checked, not run, and
  // their times predicted by a cost model (ops/TimeEstimate.hpp); the end returns microseconds.
  bool supportsTimeEstimation() const override { return true; }
  void startTimeEstimate() MPIGPU_OVERRIDE_SINCE_2_15;
  float endTimeEstimate() MPIGPU_OVERRIDE_SINCE_2_15;

  // Splitting (torch's split_group, and DeviceMesh where the default group has a device_id):
  // collective over this group, each rank passing its own child's ranks in child-rank order, or
  // another child's where it is in none (it gets null). One MPI_Comm_split on the engine, after
  // the ops queued before it; members that passed different ranks all get a ValueError.
  // torch 2.8 splits NCCL groups only.
  bool supportsSplitting() const override { return MPIGPU_TORCH_HAS_SPLIT; }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
      const c10::intrusive_ptr<Options>& opts) MPIGPU_OVERRIDE_SINCE_2_9;
#if MPIGPU_TORCH_HAS_SHRINK
  // Shrinking (torch's shrink_group, torch >= 2.10): collective over the ranks that stay, which
  // get a group of them in their order; the excluded ranks take no part. One
  // MPI_Comm_create_group over the stayers, on the engine after the ops queued before it;
  // SHRINK_ABORT first aborts this group (its outstanding ops fail), so an op waiting for an
  // excluded rank cannot hold the shrink. Standard MPI: the excluded ranks must still be alive
  // (a dead rank ends an MPI job). ULFM, a group with failed ranks: shrinkSurvivors.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
      const c10::intrusive_ptr<Options>& optsOverride) override;
  MPI_Comm shrinkSurvivors(const std::vector<int64_t>& ranksToExclude, bool isDefault);
#endif
  // The options a split child starts from (torch copies them; CopyableOptions says why).
  c10::intrusive_ptr<Options> getBackendOptions() MPIGPU_OVERRIDE_SINCE_2_9;
  // torch 2.13's split_group deep-copies the parent's options, which the base class's Python
  // binding cannot do: this one can (init.cpp binds __copy__ and __deepcopy__).
  struct CopyableOptions : Options {
    using Options::Options;
  };
  // torch's _set_pg_timeout; TORCH_MPIGPU_TIMEOUT, when set, still wins (it is the user's
  // override of every group's timeout).
  void setTimeout(std::chrono::milliseconds timeout) MPIGPU_OVERRIDE_SINCE_2_9;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // torch's ProcessGroup._enable_collectives_timing(): accepted; every op is timed anyway (its
  // start and finish on the host clock: Work.get_duration() and the flight recorder).
  void enableCollectivesTiming() override {}
  // SUCCESS, or COMM_ERROR once the group was aborted (an op's own failure raises from wait()).
  c10d::ErrorType getError() override;
  void setSequenceNumberForGroup() override {}
  // Collectives only, as NCCL's seqCollective_: torch's ProcessGroupWrapper
  // (TORCH_DISTRIBUTED_DEBUG=DETAIL) compares it across ranks, and p2p ops differ per rank.
  uint64_t getSequenceNumberForGroup() override { return collectives_->load(); }
  // Runs what is queued, then frees the communicators; bounded by the group's timeout, after
  // which it aborts. The destructor does the same.
  void shutdown() override;
  // c10d's abort (torch.distributed's _abort_process_group): returns at once; outstanding ops
  // fail. An op blocked inside MPI cannot be interrupted: its thread is left behind, and the
  // process then ends with MPI_Abort at exit instead of finalising.
  void abort() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  // Sparse COO tensors (Sparse.hpp; torch sends CUDA ones here, CPU ones to allreduce, which
  // forwards them): one op, ordered with the group's others.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // One line per setting and path, for torch_mpi_gpu.info() and debug logs.
  std::string describe() const;
  // What starts each of this group's log lines (c10 logging): "[mpigpu group 'NAME' rank R/N,
  // world rank W] ", as NCCL's createLogPrefix names its group and rank.
  std::string logPrefix() const;

 private:
  // A planned collective (ops/OpPlan.hpp): numbered, recorded, watched, then run on the
  // calling thread where it is small, blocking and the engine idle, else on the engine.
  c10::intrusive_ptr<c10d::Work> enqueue(ops::Plan plan);
  // One Work per op, collectives and point-to-point alike; recorded when a coalescing block is
  // open (the second value says whether one is).
  // Each is recorded in the flight recorder and, while the profiler runs, with its communication
  // parameters (record_param_comms). `peer`: point-to-point only, the other group rank.
  std::pair<c10::intrusive_ptr<WorkMPIGPU>, bool> newWork(
      c10d::OpType type, const char* op, uint64_t seq, std::vector<at::Tensor> outputs,
      std::vector<at::Tensor> inputs, std::chrono::milliseconds timeout,
      const std::shared_ptr<paths::OpBuffers>& bufs, bool asyncOp, int peer = -1);
  // The arguments of a send or receive: a tensor MPI can carry, a peer of the group (not this
  // rank), a tag in MPI's range; errors name `op` and this rank.
  void checkP2P(const char* op, const at::Tensor& tensor, int peer, int tag) const;
  c10::intrusive_ptr<c10d::Work> enqueueP2P(c10d::OpType type, const char* op, at::Tensor tensor,
                                            int peer, int tag);
  // at creation, on the engine: the communicators, the agreed GPU presence, the node topology
  void makeComms(int hasGpu, MPI_Comm made);
  std::function<std::string()> givingUpOnFailedMember(MPI_Comm made) const;
  void readNodes(int hasGpu);  // at creation: node_, spansNodes_
  // The engine, or a ValueError naming `op` when the group was destroyed or aborted.
  std::shared_ptr<Engine> currentEngine(const char* op) const;
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds optTimeout) const;
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeoutMs_.load(std::memory_order_relaxed));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  const std::string groupName_;
  const std::vector<int> globalRanks_;
  const bool defaultGroup_;      // torch's default group (made with no global ranks)
  size_t flightRecorderId_ = 0;  // the group's id in flight-recorder dumps
  Config config_;
  // Read by callers' threads while setTimeout may write it.
  std::atomic<int64_t> timeoutMs_;
  mpi::Comm comm_;
  // A duplicate of comm_ for our algorithms' point-to-point, so users' messages never match ours.
  mpi::Comm algoComm_;
  // Some member has a GPU (agreed at creation): decides the algorithms on every rank alike.
  bool groupHasGpu_ = false;
  // TORCH_MPIGPU_ALGO, resolved against the algorithm table.
  algo::Policy policy_;
  // Receives from any source: posted, or matched by probe (TORCH_MPIGPU_ANY_SOURCE_RECV).
  mpi::AnySourceChoice anySource_;
  // Which ranks share a node and the shared memory among them (groups of host ranks only: the
  // node algorithms serve host tensors); null where the group has no use for them.
  std::unique_ptr<node::Node> node_;
  // The group's ranks are on more than one node (read at creation with or without node_): auto
  // takes the ring for large host all_reduce there.
  bool spansNodes_ = false;
  std::string nodesWithoutNode_;  // describe()'s nodes where node_ is null
  std::unique_ptr<paths::PathFactory> paths_;
  // Whether the ranks issue the same collectives (ops/Desync.hpp).
  DesyncCheck desync_{config_.desyncCheck, config_.desyncFirstOps, config_.desyncInterval};
  // What the ops (ops/) read of this group: references to the members above.
  const ops::Group group_{rank_,     size_, config_, policy_,      comm_,
                          algoComm_, node_, paths_,  groupHasGpu_, spansNodes_};
  // Read by callers, cleared by shutdown()/abort() from any thread: through currentEngine().
  mutable std::mutex engineMutex_;
  std::shared_ptr<Engine> engine_;
  std::exception_ptr gaveUp_;  // making it was given up with MPI still inside (see make())
  // Collectives issued: the same numbering on every rank, published by the watchdog.
  std::shared_ptr<std::atomic<uint64_t>> collectives_ = std::make_shared<std::atomic<uint64_t>>(0);
  // Point-to-point ops issued by this rank (numbered apart: they differ from rank to rank).
  std::atomic<uint64_t> p2pSeq_{0};
  // Open between startTimeEstimate and endTimeEstimate: enqueue and enqueueP2P hand it their op.
  ops::TimeEstimate estimate_;
  // The completed Work an estimated op returns.
  c10::intrusive_ptr<c10d::Work> estimatedWork(c10d::OpType type, const char* op,
                                               std::vector<at::Tensor> outputs);

  // The last split: torch 2.13 asks a backend that serves several device types once per type,
  // with the same store, and keeps the first child; those calls get it without splitting again
  // (on every rank alike: the store is the same object for them all, and held here so that a
  // later split's cannot take its address).
  struct LastSplit {
    c10::intrusive_ptr<c10d::Store> store;
    std::vector<int> ranks;
    std::optional<c10::weak_intrusive_ptr<c10d::Backend>> child;  // none: not a member
  };
  LastSplit lastSplit_;

  // torch's _coalescing_manager ends a block (endCoalescing) only when its body returns: an op
  // that raises inside (batch_isend_irecv with a bad peer or tag) leaves it open, and every later
  // op would be recorded into it. So the ops torch issues in a block or at its end close it when
  // they raise (BlockCloser), and startCoalescing replaces a block still open, as NCCL does.
  std::mutex coalesceMutex_;
  std::atomic<bool> coalescing_{false};  // written under coalesceMutex_; read without it by newWork
  std::vector<c10::intrusive_ptr<WorkMPIGPU>> coalesced_;
  class BlockCloser {
   public:
    BlockCloser(ProcessGroupMPIGPU& pg, const char* op)
        : pg_(pg), op_(op), raising_(std::uncaught_exceptions()) {}
    ~BlockCloser() {
      if (std::uncaught_exceptions() > raising_) pg_.closeBlockAfterError(op_);
    }
    BlockCloser(const BlockCloser&) = delete;
    BlockCloser& operator=(const BlockCloser&) = delete;

   private:
    ProcessGroupMPIGPU& pg_;
    const char* op_;
    const int raising_;
  };
  void closeBlockAfterError(const char* op) noexcept;
};

}  // namespace mpigpu
