#include "core/Settings.hpp"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <iterator>

namespace mpigpu {

namespace {

// User settings first (docs/settings.md shows them in this order), then tuning, build and test.
const SettingSpec kSettings[] = {
    // --- user ---
    {"TORCH_MPIGPU_TIMEOUT", "", "the group's timeout (30 min)", ReadAt::GroupCreationPerRank,
     "seconds before `Work.wait()` gives up on an op", Tier::User, ""},
    {"TORCH_MPIGPU_TIMEOUT_ACTION", "abort", "", ReadAt::GroupCreationPerRank,
     "a collective past its timeout is reported; `abort`: then end the job (MPI_Abort), "
     "`report`: only report",
     Tier::User, ""},
    {"TORCH_MPIGPU_DEBUG", "0", "", ReadAt::GroupCreationPerRank,
     "`1`: log each group's setup and every op queued through c10 logging at INFO "
     "(`TORCH_CPP_LOG_LEVEL=INFO`), each line prefixed with the group, rank and world rank",
     Tier::User, ""},
    {"TORCH_MPIGPU_DESYNC_CHECK", "auto", "", ReadAt::GroupCreation,
     "ranks that disagree on a collective (op, dtype, element count, root, reduce op) all get a "
     "`DistBackendError` listing each rank's call. `auto`: every collective of a group's first "
     "`DESYNC_CHECK_FIRST_OPS` before it runs, then a digest of all of them every "
     "`DESYNC_CHECK_INTERVAL` (a mismatch found late names the collective, which ran); `1`: "
     "every collective before it runs (one small allgather each); `0`: off",
     Tier::User, ""},
    {"TORCH_MPIGPU_FR_STACKS", "0", "", ReadAt::FirstOp,
     "`1`: the flight recorder also keeps the Python stack that issued each op, so torch's "
     "analyzer names the line; about 0.7 us per op. The recorder itself follows torch's "
     "`TORCH_FR_BUFFER_SIZE` (default 2000 ops, `0`: off)",
     Tier::User, ""},
    {"TORCH_MPIGPU_CUDA_AWARE", "auto", "", ReadAt::GroupCreation,
     "CUDA tensors: `auto` asks the MPI library; `1` device pointers (cuda-direct); `0` staged "
     "through pinned host memory",
     Tier::User, ""},
    {"TORCH_MPIGPU_ALGO", "auto", "", ReadAt::GroupCreation,
     "collective algorithm: `auto`, `mpi` (MPI's own), or one of ours by name: `node`, `ring`, "
     "`rhd`, `allgather` (`python -m torch_mpi_gpu.info` lists them with the ops each serves; a "
     "reduction one does not serve uses the ring, all_gather and broadcast MPI's own). Every rank "
     "must use the same value",
     Tier::User, ""},
    {"TORCH_MPIGPU_MPI_YIELD", "auto", "", ReadAt::Import,
     "a waiting rank gives its core away (its MPI waits test, yield, then sleep up to 0.5 ms; "
     "Open MPI's `mpi_yield_when_idle` set unless the user set it). `auto`: when an unbound "
     "rank sees fewer cores than ranks on its host; `1` always; `0` never",
     Tier::User, ""},
    {"TORCH_MPIGPU_ABORT_ON_EXCEPTION", "1", "", ReadAt::UncaughtException,
     "a rank leaving on an uncaught exception prints its traceback and ends the job "
     "(`MPI_Abort`); `0`: off",
     Tier::User, ""},
    {"TORCH_MPIGPU_SET_DEVICE", "1", "", ReadAt::Rendezvous,
     "make `cuda:(local rank mod devices)` current before MPI starts; `0`: leave it", Tier::User,
     ""},
    {"TORCH_MPIGPU_AUTO_ENV", "1", "", ReadAt::Rendezvous,
     "under an MPI launcher, meet over MPI (no `MASTER_ADDR`/`MASTER_PORT` set) and fill `RANK`, "
     "`WORLD_SIZE`, `LOCAL_RANK` when unset; `0`: off",
     Tier::User, ""},
    {"TORCH_MPIGPU_MASTER_PORT", "", "a free port", ReadAt::Rendezvous,
     "set: a TCP store instead of meeting over MPI, on this port at an address mpigpu agrees",
     Tier::User, ""},

    // --- tuning ---
    {"TORCH_MPIGPU_INLINE_BYTES", "1099511627776", "`1099511627776` (no limit)",
     ReadAt::GroupCreationPerRank,
     "blocking host ops up to this size run on the calling thread when the group is idle, and "
     "host send/recv are posted there and tested by `wait()`; `0`: always on the worker",
     Tier::Tuning,
     "no limit: the caller waits anyway; running there saves the hand-off at every size"},
    {"TORCH_MPIGPU_DESYNC_CHECK_FIRST_OPS", "64", "", ReadAt::GroupCreation,
     "`DESYNC_CHECK=auto`: a group compares each of its first this many collectives before it "
     "runs",
     Tier::Tuning, "covers a program's set-up and first steps, where a mismatch shows first"},
    {"TORCH_MPIGPU_DESYNC_CHECK_INTERVAL", "64", "", ReadAt::GroupCreation,
     "`DESYNC_CHECK=auto`: after those, the collectives numbered a multiple of this compare the "
     "digest of all since the last check",
     Tier::Tuning,
     "one small allgather per 64 ops: under 1% of an 8 B all_reduce (performance.md)"},
    {"TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL", "2147483647", "", ReadAt::GroupCreation,
     "largest element count per MPI call; larger messages are split (lower it only to test "
     "splitting)",
     Tier::Tuning, "MPI's `int` count limit"},
    {"TORCH_MPIGPU_CUDA_PROBE", "auto", "", ReadAt::GroupCreation,
     "where the library reports CUDA support and `CUDA_AWARE=auto`: `auto` checks it at the "
     "first group with a GPU (device send/recv and all-gather; wrong bytes stage CUDA tensors, "
     "with a warning); `off` takes the library's word",
     Tier::Tuning, "a library's claim is not proof (architecture.md, data paths)"},
    {"TORCH_MPIGPU_CUDA_REDUCE", "auto", "", ReadAt::GroupCreation,
     "CUDA reductions where other ops go direct. MPI's own collectives: `auto` staged on Open "
     "MPI (it reduces device buffers on the host anyway), direct elsewhere. Ours: `auto` "
     "device pointers from `CUDA_DIRECT_BYTES`, pinned staging below; `direct`; `staged`",
     Tier::Tuning, "Open MPI's coll/cuda copies device buffers to the host to reduce them"},
    {"TORCH_MPIGPU_CUDA_ORDER_EVENTS", "auto", "", ReadAt::GroupCreationPerRank,
     "stream events ordering a CUDA op after the caller's stream and `Work.wait()`'s stream "
     "after the op: `auto` records each only where its stream has work queued; `always` in "
     "every op (for inputs from a blocking stream made outside torch)",
     Tier::Tuning,
     "an event is a device command: one queued for nothing costs a device round trip"},
    {"TORCH_MPIGPU_ANY_SOURCE_RECV", "auto", "", ReadAt::GroupCreation,
     "`recv(src=None)`: `post` hands MPI_Irecv(MPI_ANY_SOURCE) to the library; `probe` matches "
     "each with MPI_Improbe and MPI_Imrecv; `auto`: probe on MPICH's ucx netmod (it loses such "
     "receives), post elsewhere",
     Tier::Tuning, "MPICH's ucx netmod loses posted any-source receives (tests/mp/p2p_stress.py)"},
    {"TORCH_MPIGPU_NODE_BUFFER_BYTES", "1048576", "", ReadAt::GroupCreation,
     "node-aware algorithms: shared memory per rank and half (twice this per rank and group, made "
     "at the group's first node-aware op); bigger ops go in pieces of this size. `0`: no shared "
     "memory, the node algorithm off",
     Tier::Tuning, "pieces of 1 MiB keep the copy in and the reduction pipelined in cache"},
    {"TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES", "33554432", "", ReadAt::GroupCreation,
     "node algorithm where every member has a GPU (`ALGO=node` only): device memory per rank "
     "and half, mapped into the peers by CUDA IPC; doubled up to "
     "`NODE_DEVICE_BUFFER_MAX_BYTES` at the first op that would fit in one piece",
     Tier::Tuning, "not measured: a starting size that the slots grow from"},
    {"TORCH_MPIGPU_NODE_DEVICE_BUFFER_MAX_BYTES", "268435456", "", ReadAt::GroupCreation,
     "the most the node algorithm's device slots grow to, per rank and half; bigger ops go in "
     "pieces of this size",
     Tier::Tuning, "not measured: a memory cap (256 MiB per rank and half)"},
    {"TORCH_MPIGPU_NODE_DEVICE_ORDER", "auto", "", ReadAt::GroupCreation,
     "node algorithm in device slots, how ranks wait for each other: `host` (its GPU, then a "
     "host barrier), `device` (a kernel waits on peers' flags), `auto`: `device` where every "
     "rank has a GPU of its own",
     Tier::Tuning,
     "a kernel that spins on another process's flag pays a whole time slice on a shared GPU"},
    {"TORCH_MPIGPU_NODE_LEADER", "auto", "", ReadAt::GroupCreation,
     "node algorithm: `1` the node's first rank reduces one-node all_reduce and reduce_scatter "
     "for all and gathers all_gather's rows (each peer's device work in one turn per op); `0` "
     "every rank reduces its share; `auto`: `1` in device slots ordered from the host (ranks "
     "sharing a GPU), else `0`",
     Tier::Tuning,
     "lent H200, ranks sharing its GPU: fewer time-slice switches per op (performance.md)"},
    {"TORCH_MPIGPU_NODE_ONE_SHOT_BYTES", "65536", "", ReadAt::GroupCreation,
     "node algorithm on one node: all_reduce up to this size is one-shot (every rank reduces every "
     "input), above two-shot (each reduces 1/p, then all copy)",
     Tier::Tuning,
     "one-shot's extra reads cost less than two-shot's second barrier below 64 KiB "
     "(2-core VM, 2-4 ranks)"},
    {"TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES", "8192", "", ReadAt::GroupCreation,
     "node algorithm on host tensors: all_gather from this many bytes per rank reads the "
     "peers' buffers in place (`process_vm_readv`: one copy instead of two) where the kernel "
     "lets every rank do so (`info` says why not); `1099511627776`: never",
     Tier::Tuning,
     "below 8 KiB per rank a system call per peer costs more than the copy saved "
     "(2-core VM, performance.md)"},
    {"TORCH_MPIGPU_NODE_ACROSS_MIN_BYTES", "262144", "", ReadAt::GroupCreation,
     "auto, groups that span nodes: reductions, all_gather and broadcast from this size take the "
     "node algorithm (hierarchical), smaller ones MPI's own",
     Tier::Tuning,
     "two simulated hosts x 2 ranks: hierarchical ties MPI's own at 256 KiB, loses "
     "below (performance.md)"},
    {"TORCH_MPIGPU_NODE_HOST_MPI_FROM_BYTES", "2048", "", ReadAt::GroupCreation,
     "auto, no GPU, one node: all_reduce (not fp16/bf16) from this size to below "
     "`NODE_HOST_MPI_BELOW_BYTES` uses MPI's own, not the node algorithm",
     Tier::Tuning, "2 ranks: MPI's own ahead from 2 KiB (performance.md)"},
    {"TORCH_MPIGPU_NODE_HOST_MPI_BELOW_BYTES", "33554432", "", ReadAt::GroupCreation,
     "the top of that window", Tier::Tuning, "2 ranks: the node algorithm ahead from 32 MiB"},
    {"TORCH_MPIGPU_NODE_HOST_MPI_CROWDED_FROM_BYTES", "8192", "", ReadAt::GroupCreation,
     "`NODE_HOST_MPI_FROM_BYTES` where a host runs more ranks than cores", Tier::Tuning,
     "3-4 ranks on 2 cores: the node algorithm ahead below 8 KiB"},
    {"TORCH_MPIGPU_NODE_HOST_MPI_CROWDED_BELOW_BYTES", "4194304", "", ReadAt::GroupCreation,
     "`NODE_HOST_MPI_BELOW_BYTES` there", Tier::Tuning, "there: the node algorithm from 4 MiB"},
    {"TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES", "1048576", "", ReadAt::GroupCreation,
     "auto, CUDA tensors where a node's ranks share a GPU: all_reduce from this size takes the "
     "node algorithm's leader form, smaller ones MPI's own",
     Tier::Tuning,
     "lent H200, 2 ranks sharing it: the leader form crosses MPI's own between "
     "256 KiB and 1 MiB (performance.md)"},
    {"TORCH_MPIGPU_ALGO_MIN_BYTES", "2097152", "", ReadAt::GroupCreation,
     "auto, groups with a GPU: reductions below this use MPI's own collectives, from here the "
     "ring (or, where a node's ranks share a GPU, the node algorithm's leader form)",
     Tier::Tuning,
     "lent H100 and H200, 2 ranks: the ring on the GPU beats Open MPI's host "
     "reduction from 1-4 MiB (performance.md)"},
    {"TORCH_MPIGPU_ALGO_PIECE_BYTES", "33554432", "", ReadAt::GroupCreation,
     "largest message of our algorithms (pieces pipeline against the reduction)", Tier::Tuning,
     "lent H100: pieces of 32 MiB beat 4 MiB ones at 256 MiB (1646 against 1927 us)"},
    {"TORCH_MPIGPU_CUDA_DIRECT_BYTES", "1048576", "", ReadAt::GroupCreation,
     "our algorithms on a CUDA-aware MPI with `CUDA_REDUCE=auto`: ops from this size send device "
     "pointers",
     Tier::Tuning, "below 1 MiB a pinned copy costs less than a CUDA IPC hand-off"},
    {"TORCH_MPIGPU_HOST_HALF_RING_BYTES", "65536", "", ReadAt::GroupCreation,
     "auto, groups without a GPU: fp16/bf16 all_reduce and reduce_scatter from this size use the "
     "ring",
     Tier::Tuning,
     "MPI's user-defined fp16 op is slower than the ring's vectorised reduction "
     "from 64 KiB (2-core VM, 2 ranks)"},
    {"TORCH_MPIGPU_HOST_RS_RING_BYTES", "1048576", "", ReadAt::GroupCreation,
     "auto, groups without a GPU: reduce_scatter from this size uses the ring", Tier::Tuning,
     "2-core VM, 2 ranks: the ring 2.3x faster than Open MPI's own at 1 MiB"},
    {"TORCH_MPIGPU_HOST_ACROSS_RING_BYTES", "4194304", "", ReadAt::GroupCreation,
     "auto, groups without a GPU that span nodes (where the node algorithm does not run): "
     "all_reduce from this size uses the ring",
     Tier::Tuning,
     "two simulated hosts: Open MPI 5's own all_reduce ran the 10 Gbit/s link at "
     "half speed from 4 MiB (performance.md)"},
    {"TORCH_MPIGPU_STAGING_CHUNK_BYTES", "4194304", "", ReadAt::GroupCreation,
     "cuda-staged: piece size of the copy/MPI pipeline", Tier::Tuning,
     "not measured: large enough that a copy's launch cost is small against its bytes"},
    {"TORCH_MPIGPU_FUSION_BYTES", "67108864", "", ReadAt::GroupCreation,
     "most bytes packed into one MPI call when an op carries many tensors; `0`: every tensor "
     "alone",
     Tier::Tuning, "Horovod's default fusion buffer (64 MiB)"},
    {"TORCH_MPIGPU_FUSE_BELOW_BYTES", "262144", "", ReadAt::GroupCreation,
     "without a GPU in the group, tensors this big are not packed (the copy costs more than "
     "the call saved); with one everything is packed (every rank must cut the same buckets)",
     Tier::Tuning,
     "2-core VM, 2 ranks: packing a 256 KiB tensor costs more than its call "
     "(benchmarks/fusion_bench.py)"},
    {"TORCH_MPIGPU_COST_LATENCY_NS", "1600", "", ReadAt::GroupCreation,
     "`_time_estimator`'s model: a message's latency inside a node", Tier::Tuning,
     "2-core VM, 2 ranks: raw MPI's 8 B all_reduce (results/*own-cost)"},
    {"TORCH_MPIGPU_COST_MB_PER_S", "3479", "", ReadAt::GroupCreation, "its bandwidth (bytes/us)",
     Tier::Tuning, "that run: mpigpu's 16 MiB all_reduce as a ring"},
    {"TORCH_MPIGPU_COST_ACROSS_LATENCY_NS", "14700", "", ReadAt::GroupCreation,
     "the same across nodes", Tier::Tuning,
     "2 simulated hosts: raw MPI's 8 B all_reduce (results/*allreduce-window)"},
    {"TORCH_MPIGPU_COST_ACROSS_MB_PER_S", "947", "", ReadAt::GroupCreation, "the same across nodes",
     Tier::Tuning, "that run: mpigpu's 16 MiB all_reduce (10 Gbit/s)"},

    // --- build (read by setup.py) ---
    {"MPI_HOME", "/opt/openmpi-cuda", "", ReadAt::Build,
     "the MPI to build against; empty: the mpicc on PATH or this environment's, never the default",
     Tier::Build, ""},
    {"TORCH_MPIGPU_WITH_CUDA", "auto", "", ReadAt::Build, "compile the CUDA sources", Tier::Build,
     ""},
    {"TORCH_MPIGPU_DEBUG_INFO", "lines", "", ReadAt::Build,
     "debug info in the extension: lines (file:line in backtraces), full (variables too), none",
     Tier::Build, ""},
    {"TORCH_MPIGPU_PRECOMPILED_HEADER", "1", "", ReadAt::Build,
     "compile torch's headers once per build (GCC only; `csrc/PrecompiledHeaders.hpp`), "
     "a build ~35% shorter; `0`: each unit parses them",
     Tier::Build, ""},
    {"TORCH_MPIGPU_UNITY_BUILD", "1", "", ReadAt::Build,
     "compile each folder of `csrc/` as one unit (`build/units/`): about half the build's CPU; "
     "names in anonymous namespaces must then differ within a folder; `0`: one unit per file",
     Tier::Build, ""},

    // --- tests only ---
    {"TORCH_MPIGPU_TEST_PRETEND_NODES", "1", "", ReadAt::GroupCreation,
     "cut each node into this many nodes of consecutive ranks, so the hierarchical algorithms "
     "run on one host",
     Tier::Test, ""},
    {"TORCH_MPIGPU_TEST_DEVICE_SLOTS", "0", "", ReadAt::GroupCreation,
     "`1` runs the node algorithm's device-slot code (what the CUDA IPC slots use) on host shared "
     "memory in groups without a GPU, so CPU CI covers it",
     Tier::Test, ""},
    {"TORCH_MPIGPU_TEST_HOST_PIECE_BYTES", "0", "", ReadAt::GroupCreationPerRank,
     "this rank's host paths cut all_reduce, reduce (MPI's own) and broadcast into MPI calls of "
     "this many bytes, as a staging GPU rank does; set on some ranks only, it checks that every "
     "rank of the group cuts the same pieces",
     Tier::Test, ""},
    {"TORCH_MPIGPU_TEST_NO_SINGLE_COPY", "0", "", ReadAt::GroupCreationPerRank,
     "`1` fails this rank's single-copy probe, as where the kernel forbids it; the group then "
     "copies through the slots as one",
     Tier::Test, ""},
    {"TORCH_MPIGPU_TEST_CUDA_PROBE_FAILS", "0", "", ReadAt::GroupCreation,
     "`1`: this rank's CUDA-awareness check (`CUDA_PROBE=auto`) fails on purpose, as wrong bytes "
     "would",
     Tier::Test, ""},
};

}  // namespace

const std::vector<SettingSpec>& settings() {
  static const std::vector<SettingSpec> table(std::begin(kSettings), std::end(kSettings));
  return table;
}

const SettingSpec& setting(std::string_view name) {
  for (const auto& spec : settings()) {
    if (name == spec.name) return spec;
  }
  TORCH_INTERNAL_ASSERT(false, "mpigpu: setting ", name,
                        " is read but missing from csrc/core/Settings.cpp");
}

std::string sharedSettings() {
  std::string lines;
  for (const auto& spec : kSettings) {
    if (spec.readAt != ReadAt::GroupCreation) continue;
    const char* set = std::getenv(spec.name);
    lines += c10::str(spec.name, "=", set != nullptr ? set : spec.defaultValue, "\n");
  }
  return lines;
}

const char* tierName(Tier tier) {
  switch (tier) {
    case Tier::User: return "user";
    case Tier::Tuning: return "tuning";
    case Tier::Build: return "build";
    case Tier::Test: return "test";
  }
  return "?";
}

const char* readAtName(ReadAt readAt) {
  switch (readAt) {
    case ReadAt::GroupCreation: return "group creation";
    case ReadAt::GroupCreationPerRank: return "group creation (each rank its own)";
    case ReadAt::FirstOp: return "first op";
    case ReadAt::Import: return "import";
    case ReadAt::Rendezvous: return "rendezvous";
    case ReadAt::UncaughtException: return "uncaught exception";
    case ReadAt::Build: return "build";
  }
  return "?";
}

}  // namespace mpigpu
