// The TORCH_MPIGPU_* settings a process group uses, parsed and typed. Names, defaults and meanings
// live in one table (Settings.cpp); read once per process group at creation, so tests can change
// them between groups.
#pragma once

#include <cstdint>
#include <string>

namespace mpigpu {
// How CUDA tensors meet MPI (TORCH_MPIGPU_CUDA_AWARE=auto|1|0): ask the MPI library, device
// pointers (CUDA-aware MPI), or staged through pinned host memory.
enum class CudaAware : int8_t { Auto, DevicePointers, Staged };
// Reductions on CUDA tensors when the other ops go as device pointers
// (TORCH_MPIGPU_CUDA_REDUCE=auto|direct|staged); Auto: staged where the MPI reduces device
// buffers on the host anyway (Open MPI), device pointers elsewhere.
// TORCH_MPIGPU_DESYNC_CHECK=0|auto|1 (ops/Desync.hpp).
enum class DesyncMode : int8_t { Off, Sampled, Every };
enum class CudaReduce : int8_t { Auto, Direct, Staged };
// Whether a library's word that it is CUDA-aware is checked (TORCH_MPIGPU_CUDA_PROBE=auto|off;
// mpi/DirectProbe.hpp): Auto probes at the first group with a GPU, Off takes the word, Fail
// (tests only, TORCH_MPIGPU_TEST_CUDA_PROBE_FAILS=1) makes the probe fail on purpose.
enum class CudaProbe : int8_t { Auto, Off, Fail };
// How the node algorithm's ranks wait for each other in device slots
// (TORCH_MPIGPU_NODE_DEVICE_ORDER=auto|host|device; node/DeviceSlots.hpp).
enum class NodeDeviceOrder : int8_t { Auto, Host, Device };
// The node algorithm's leader form (TORCH_MPIGPU_NODE_LEADER=auto|1|0;
// algorithms/NodeAlgorithms.cpp): the node's first rank reduces one-node all_reduce and
// reduce_scatter for all and takes all_gather's rows after its peers have placed theirs, so each
// peer's device work comes in one turn per op (a GPU the ranks share switches twice, not 4-6
// times).
enum class NodeLeader : int8_t { Auto, On, Off };
// How receives from any source meet MPI (TORCH_MPIGPU_ANY_SOURCE_RECV=auto|post|probe;
// mpi/AnySource.hpp).
enum class AnySourceRecv : int8_t { Auto, Post, Probe };

// Filled by fromEnv(); the defaults are in the settings table (Settings.cpp), not here.
struct Config {
  // Largest element count handed to one MPI call; bigger messages are split (MPI counts are int).
  int64_t maxElementsPerCall = 0;
  bool debug = false;  // TORCH_MPIGPU_DEBUG=1: log the group's setup and every op queued
  // TORCH_MPIGPU_DESYNC_CHECK: which collectives are compared across ranks (ops/Desync.hpp)
  DesyncMode desyncCheck = DesyncMode::Sampled;
  int64_t desyncFirstOps = 0;  // Sampled: every collective up to this number
  int64_t desyncInterval = 1;  // Sampled: then every collective whose number is a multiple
  // Overrides the process group timeout when > 0 (TORCH_MPIGPU_TIMEOUT, seconds).
  double timeoutSeconds = 0;
  // A collective still inside MPI after the timeout is reported; true: then end the job with
  // MPI_Abort (TORCH_MPIGPU_TIMEOUT_ACTION=abort, the default), false: report only.
  bool abortOnTimeout = true;
  CudaAware cudaAware = CudaAware::Auto;
  CudaReduce cudaReduce = CudaReduce::Auto;
  CudaProbe cudaProbe = CudaProbe::Auto;
  // TORCH_MPIGPU_CUDA_ORDER_EVENTS=always: a CUDA op records its ordering events even where the
  // stream has no work left (cuda/CudaPaths.cpp: CudaOpBuffers::issued, stageOut).
  bool cudaOrderEventsAlways = false;
  AnySourceRecv anySourceRecv = AnySourceRecv::Auto;
  // Piece size of the staged path's pipeline: copies of one piece overlap MPI on the previous.
  int64_t stagingChunkBytes = 0;
  // Most bytes packed into one fused MPI call when an op gets many tensors (allreduce lists,
  // coalesced calls, DDP buckets).
  int64_t fusionBytes = 0;
  // Host tensors at least this big are not packed (the copy would cost more than the MPI call it
  // saves); they travel in place, one MPI call each, within the same op.
  int64_t fuseBelowBytes = 0;
  // Blocking ops (async_op=False) on host tensors up to this many bytes run on the calling thread
  // when the group's engine is idle; 0 always hands ops to the engine.
  int64_t inlineBytes = 0;

  // TORCH_MPIGPU_ALGO: `auto`, `mpi`, or the name of a row of the algorithm table, which the
  // group resolves when it is made (algorithms/Algorithms.hpp: policyFor).
  std::string algo;
  // Largest message of our algorithms; pieces of one step pipeline against the reduction.
  int64_t algoPieceBytes = 0;
  // auto, in groups with a GPU: reductions below this use MPI's own collectives (CUDA tensors
  // staged through pinned memory), from here the ring, whose device messages and kernels cost
  // more per op but reduce on the GPU.
  int64_t algoMinBytes = 0;
  // auto, in groups without a GPU: fp16/bf16 reductions of at least hostHalfRingBytes use the
  // ring (MPI reduces them with a user-defined op one element at a time), and reduce_scatter of
  // at least hostReduceScatterRingBytes too.
  int64_t hostHalfRingBytes = 0;
  int64_t hostReduceScatterRingBytes = 0;
  // ... and in groups that span nodes (without the node algorithm: one rank per node, uneven
  // nodes, NODE_BUFFER_BYTES=0), all_reduce from hostAcrossRingBytes: Open MPI's own exchange
  // posts its receive before its send (as its sendrecv does), which halves a TCP link's speed for
  // large messages; the ring posts its sends first. (Each default's measurement: the settings'
  // rows in Settings.cpp, docs/settings.md.)
  int64_t hostAcrossRingBytes = 0;
  // CUDA_REDUCE=auto with a CUDA-aware MPI: our algorithms' messages go as device pointers for
  // ops of at least this many bytes, through pinned host memory below (device messages pay for
  // the GPU's context switches on a shared GPU and for IPC set-up).
  int64_t cudaDirectBytes = 0;
  // The node-aware algorithms: bytes of shared memory per rank and half (0: none, and the
  // algorithms off); all_reduce up to nodeOneShotBytes is one-shot (one barrier, every rank
  // reduces everything), larger two-shot (two barriers, each rank reduces 1/p).
  int64_t nodeBufferBytes = 0;
  int64_t nodeOneShotBytes = 0;
  // Host all_gather from this size per rank reads the peers' buffers in place (one copy,
  // process_vm_readv) where the kernel lets every rank do so; below, through the slots.
  int64_t nodeSingleCopyBytes = 0;
  // Tests only: this rank's single-copy probe fails (the group must fall back as one).
  bool testNoSingleCopy = false;
  // Groups whose every member has a GPU: the node algorithm's slots in device memory (CUDA IPC),
  // per rank and half; ops are cut into pieces of this size, each piece two host round trips.
  int64_t nodeDeviceBufferBytes = 0;
  int64_t nodeDeviceBufferMaxBytes = 0;  // ... grown on demand up to this
  NodeDeviceOrder nodeDeviceOrder = NodeDeviceOrder::Auto;
  NodeLeader nodeLeader = NodeLeader::Auto;
  // Tests only: groups without a GPU run the device-slot code on host memory.
  bool nodeTestDeviceSlots = false;
  // Tests only: this rank's host paths cut all_reduce/reduce/broadcast into MPI calls of this
  // many bytes, as a staging device does (0: whole); the group then agrees on one cut.
  int64_t testHostPieceBytes = 0;
  // auto: groups that span nodes take the node algorithm (hierarchical) from this size.
  int64_t nodeAcrossMinBytes = 0;
  // auto, groups without a GPU inside one node: all_reduce (not fp16/bf16) from
  // nodeHostMpiFromBytes up to below nodeHostMpiBelowBytes (the Crowded pair where a member's
  // host has more ranks than cores) takes MPI's own, the node algorithm outside that window (the
  // evidence: algorithms/Algorithms.cpp, nodePicks).
  int64_t nodeHostMpiFromBytes = 0;
  int64_t nodeHostMpiBelowBytes = 0;
  int64_t nodeHostMpiCrowdedFromBytes = 0;
  int64_t nodeHostMpiCrowdedBelowBytes = 0;
  // auto: all_reduce of CUDA tensors where the ranks of one node share a GPU takes the node
  // algorithm's leader form from this size (the evidence: algorithms/Algorithms.cpp, nodePicks).
  int64_t nodeSharedGpuAllreduceBytes = 0;
  // The time estimate's model (ops/TimeEstimate.hpp): one message's latency and the bandwidth,
  // inside a node and, for groups that span nodes, across them. Shared by every rank: torch's
  // compiler orders collectives by the estimates, and ranks that order them differently hang.
  double costLatencyUs = 0;
  double costBytesPerUs = 0;
  double costAcrossLatencyUs = 0;
  double costAcrossBytesPerUs = 0;
  // Test-only: each real node is cut into this many pretend nodes (hierarchical code on one host).
  int pretendNodes = 1;
  // The settings every rank must share (Settings.hpp: sharedSettings), as read with the rest;
  // the group compares them across its ranks when it is made.
  std::string sharedSettings;

  static Config fromEnv();
};

}  // namespace mpigpu
