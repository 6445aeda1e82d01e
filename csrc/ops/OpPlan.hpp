// The collectives' front door below the process group: each op is checked, then planned (its
// buffers, its fused buckets and its algorithm, chosen once), and the plan is handed back for the
// group to enqueue. The group routes; everything an op decides is here (ops/Reductions.cpp,
// ops/Movement.cpp), the way NCCL's front door hands one plan to its enqueue.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "core/Config.hpp"
#include "algorithms/Algorithms.hpp"
#include "mpi/Collectives.hpp"
#include "node/Node.hpp"
#include "paths/Devices.hpp"

namespace mpigpu::ops {

// What planning and running an op read of its group. References to the group's own members, set
// once when the group is made; a plan's body holds a pointer to it, as long-lived as the group.
struct Group {
  int rank;
  int size;
  const Config& config;
  const algo::Policy& policy;
  const mpi::Comm& comm;      // users' collectives and MPI's own
  const mpi::Comm& algoComm;  // our algorithms' point-to-point (never matches users' messages)
  const std::unique_ptr<node::Node>& node;  // null where the group has no use for one
  const std::unique_ptr<paths::PathFactory>& paths;
  const bool& hasGpu;      // some member has a GPU (agreed at creation)
  const bool& spansNodes;  // the ranks are on more than one node

  algo::Facts facts(algo::OpKind kind, const std::vector<at::Tensor>& tensors) const;
  // null: MPI's own collectives
  const algo::Algorithm* choose(algo::OpKind kind, const std::vector<at::Tensor>& tensors) const;
  // The node algorithm in device slots: it settles before every barrier and MPI call, and its
  // fallback (the ring) through links that do (OpBuffers::deferStartWait).
  bool onDeviceSlots(const algo::Algorithm* a) const;
  std::shared_ptr<paths::OpBuffers> buffers(const at::Tensor& t) const {
    return paths->create(t.device());
  }
  // Buffers for a reduction: made for our algorithms (the device reduces) or for MPI's.
  std::shared_ptr<paths::OpBuffers> reduceBuffers(const at::Tensor& t, bool ours) const {
    return paths->create(t.device(), ours ? paths::Use::Algorithm : paths::Use::Reduce);
  }
  // The fused buckets of a coalesced op, the same on every rank (Fusion.hpp: fuseBelow).
  std::vector<std::vector<size_t>> buckets(const std::vector<at::Tensor>& tensors) const;

  // Runs `fn` with a context for our algorithms over `buf`'s bytes.
  void withAlgorithm(const paths::OpBuffers& bufs, const char* op, const at::Tensor& buf,
                     const mpi::Reduction& red,
                     const std::function<void(algo::Context&)>& fn) const;
  // All-gather / broadcast through `mover` where it serves the op, else MPI's own.
  void gatherAll(const paths::OpBuffers& bufs, const char* op, const algo::Algorithm* mover,
                 const at::Tensor& in, at::Tensor& out) const;
  void broadcastFrom(const paths::OpBuffers& bufs, const char* op, const algo::Algorithm* mover,
                     at::Tensor& buf, int root) const;
};

// One op, checked and planned: what the group enqueues.
struct Plan {
  c10d::OpType type;
  const char* op;
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> inputs;
  std::chrono::milliseconds timeout;  // c10d::kUnsetTimeout: the group's
  bool asyncOp;
  std::shared_ptr<paths::OpBuffers> bufs;
  std::function<void(paths::OpBuffers&)> body;  // on the engine, between stage-in and stage-out
  int root = -1;
  int redop = -1;  // reductions: the c10d::ReduceOp kind (the desync check compares it)
};

// Reductions (ops/Reductions.cpp)
Plan allreduce(const Group& g, std::vector<at::Tensor>& tensors,
               const c10d::AllreduceOptions& opts);
Plan allreduceSparse(const Group& g, std::vector<at::Tensor>& tensors,
                     const c10d::AllreduceOptions& opts);
Plan reduce(const Group& g, std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts);
Plan reduceScatter(const Group& g, std::vector<at::Tensor>& outputs,
                   std::vector<std::vector<at::Tensor>>& inputs,
                   const c10d::ReduceScatterOptions& opts);
// reduce_scatter_tensor, coalesced or not
Plan reduceScatterTensors(const Group& g, std::vector<at::Tensor>& outputs,
                          std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts);

// Data movement (ops/Movement.cpp)
Plan broadcast(const Group& g, std::vector<at::Tensor>& tensors,
               const c10d::BroadcastOptions& opts);
Plan allgather(const Group& g, std::vector<std::vector<at::Tensor>>& outputs,
               std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts);
// all_gather_into_tensor, coalesced or not
Plan allgatherTensors(const Group& g, std::vector<at::Tensor>& outputs,
                      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts);
Plan allgatherCoalesced(const Group& g, std::vector<std::vector<at::Tensor>>& outputLists,
                        std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts);
Plan gather(const Group& g, std::vector<std::vector<at::Tensor>>& outputs,
            std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts);
Plan scatter(const Group& g, std::vector<at::Tensor>& outputs,
             std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts);
Plan alltoallSingle(const Group& g, at::Tensor& output, at::Tensor& input,
                    const std::vector<int64_t>& outputSplitSizes,
                    const std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts);
Plan alltoall(const Group& g, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
              const c10d::AllToAllOptions& opts);
Plan barrier(const Group& g, const c10d::BarrierOptions& opts);

// The blocks of a reduce_scatter input list or an all_gather output list, in elements: each of
// `mine`'s kind, this rank's own of its size (`block`, `own` name them in messages).
std::vector<int64_t> blockCounts(const Group& g, const char* op,
                                 const std::vector<at::Tensor>& blocks, const at::Tensor& mine,
                                 const char* block, const char* own);

// The tensor collectives' shared shape (reduce_scatter_tensor and all_gather_into_tensor, each
// coalesced or not): every `narrow` tensor has a `wide` partner of group size x its elements,
// rank-major. Checks them alike (`narrowName`/`wideName` in messages).
void checkNarrowWide(const Group& g, const char* op, const std::vector<at::Tensor>& narrow,
                     const char* narrowName, const std::vector<at::Tensor>& wide,
                     const char* wideName);
// One MPI call per bucket: the wide partners' rank-r rows packed rank-major, so block r of the
// packed buffer is rank r's share. A wide tensor written to that is not contiguous has no row
// views and travels alone. `first` is the bucket's first tensor index (its dtype decides).
struct PackedBucket {
  size_t narrow;
  size_t wide;
  size_t first;
};
std::vector<PackedBucket> packBuckets(const Group& g, paths::OpBuffers& bufs,
                                      const std::vector<at::Tensor>& narrow,
                                      paths::Access narrowAccess,
                                      const std::vector<at::Tensor>& wide,
                                      paths::Access wideAccess);

}  // namespace mpigpu::ops
