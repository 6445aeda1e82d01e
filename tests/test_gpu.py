"""GPU tests: our CUDA reduction kernels against torch's ops; our reduction algorithms on CUDA
tensors with device-pointer and with staged messages; every op on CUDA tensors through the
cuda-direct path (when the MPI is CUDA-aware) and the cuda-staged path (forced, with a small
pipeline piece so large messages really pipeline), stream ordering, mixed CUDA/CPU ranks, DDP
with CUDA tensors, and ending a group (destroy, abort) while a CUDA op can never finish. Several
ranks share one GPU.
Marked `gpu` and skipped (not failed) where no CUDA device is visible."""

import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import run_mpi, skip_or_fail
from conftest import passed_counts
from test_multirank import (AUTO_ON_GPU, COLLECTIVES, DDP, FORCED_ALGORITHM, FSDP, fusion_behaviours,
                            p2p_groups_behaviours, split_groups_behaviours)
from test_reliability import check_ending_a_group_with_a_stuck_op

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")]
# long_first(seconds=s): the tests that took s (25-82) seconds a case on the lent H200 (2026-12-04b,
# 4 workers) start first, longest first, so no worker ends the run on one alone (tests/conftest.py)

# The paths themselves: the node algorithm off (auto would take it for all_gather and the large
# reductions where the ranks share the GPU, as here), so every op goes through the path.
STAGED = {"TORCH_MPIGPU_CUDA_AWARE": "0", "TORCH_MPIGPU_STAGING_CHUNK_BYTES": "4096",
          "MPIGPU_EXPECT_PATH": "cuda-staged", "TORCH_MPIGPU_NODE_BUFFER_BYTES": "0"}
DIRECT = {"TORCH_MPIGPU_CUDA_AWARE": "1", "TORCH_MPIGPU_CUDA_REDUCE": "direct",
          "MPIGPU_EXPECT_PATH": "cuda-direct", "MPIGPU_EXPECT_REDUCE_PATH": "cuda-direct",
          "TORCH_MPIGPU_NODE_BUFFER_BYTES": "0"}
# The default on a CUDA-aware MPI: device pointers, except reductions on Open MPI (staged), and
# auto's node algorithm (the leader form, the ranks sharing the GPU) where it takes the op.
HYBRID = {"TORCH_MPIGPU_CUDA_AWARE": "1", "TORCH_MPIGPU_CUDA_REDUCE": "auto",
          "MPIGPU_EXPECT_PATH": "cuda-direct"}


@functools.lru_cache(maxsize=None)
def auto_cuda_path():
    """What this MPI offers CUDA tensors when left to decide (one process, no mpirun needed)."""
    env = dict(os.environ, TORCH_MPIGPU_CUDA_AWARE="auto", OMPI_MCA_opal_warn_on_missing_libcuda="0")
    out = subprocess.run([sys.executable, "-m", "torch_mpi_gpu.info", "--json"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)["paths"]["cuda tensors"]


def path_env(path):
    if path in ("direct", "hybrid"):
        if not auto_cuda_path().startswith("cuda-direct"):
            # on the GPU machine a detection bug must not look like a pass
            skip_or_fail("not-cuda-aware", f"this MPI is not detected as CUDA-aware "
                         f"({auto_cuda_path()}); build against a CUDA-aware one "
                         "(scripts/build_openmpi_cuda.sh) to test cuda-direct")
        return DIRECT if path == "direct" else HYBRID
    return STAGED


REDUCE_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
KERNEL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                 torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
                 torch.uint64, torch.bool]


def torch_reference(op, a, b, scale):
    """torch's own ops on the host, as the reference for one reduction step."""
    if a.dtype == torch.bool:
        f = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
             "PRODUCT": torch.logical_and, "MIN": torch.logical_and, "BAND": torch.logical_and,
             "BXOR": torch.logical_xor}[op]
        return f(a, b)
    if a.dtype in (torch.uint16, torch.uint32, torch.uint64):  # few CPU ops for these: via int64
        wide = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
                "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
                "BXOR": torch.bitwise_xor}[op](a.to(torch.int64), b.to(torch.int64))
        return (wide & ((1 << (8 * a.element_size())) - 1 if a.element_size() < 8 else -1)).to(a.dtype)
    f = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
         "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
         "BXOR": torch.bitwise_xor}[op]
    if a.dtype in (torch.float16, torch.bfloat16):
        out = f(a.float(), b.float())
        return (out * scale if scale != 1 else out).to(a.dtype)
    out = f(a, b)
    return out * scale if scale != 1 else out


def reduce_step_cases():
    """(op, dtype, n, shift, a, b, scale, expected) for every reduce op x dtype, at sizes around
    the 16-byte vector width, misaligned views (`shift`: the scalar kernel) and a large one."""
    gen = torch.Generator().manual_seed(0)
    for dtype in KERNEL_DTYPES:
        for op in REDUCE_OPS:
            floating = dtype.is_floating_point
            if op in ("BAND", "BOR", "BXOR") and floating:
                continue
            if op == "AVG" and not floating:
                continue
            scale = 0.25 if op == "AVG" else 1.0
            for n, shift in ((0, 0), (1, 0), (7, 0), (1000, 0), (1000, 1), ((1 << 20) + 3, 0)):
                def draw():
                    if dtype == torch.bool:
                        return torch.randint(0, 2, (n + shift,), generator=gen).bool()
                    if floating:
                        return (torch.rand(n + shift, generator=gen, dtype=torch.float64) * 4 - 2).to(dtype)
                    hi = 100 if dtype in (torch.uint8, torch.int8) else 1 << 20
                    return torch.randint(0, hi, (n + shift,), generator=gen).to(dtype)
                a, b = draw()[shift:], draw()[shift:]
                yield op, dtype, n, shift, a, b, scale, torch_reference(op, a, b, scale)


def same_result(got, expect, tight=True):
    if got.dtype.is_floating_point:
        loose = not tight or got.dtype in (torch.float16, torch.bfloat16)
        return torch.allclose(got.double(), expect.double(), rtol=1e-2 if loose else 1e-6,
                              equal_nan=True)
    return torch.equal(got.to(torch.int64), expect.to(torch.int64))


def host_reducer_failures(op, dtype, n, a, b, scale, expect):
    """Our host reducer (the CPU step of our algorithms) against the reference."""
    import torch_mpi_gpu
    host = torch.empty(n, dtype=dtype)
    torch_mpi_gpu._C.reduce_step(host, a.contiguous(), b.contiguous(), op, scale)
    failures = [] if same_result(host, expect, tight=False) else [
        f"host {op} {dtype} n={n}: {host[:6]} vs {expect[:6]}"]
    # the leader form's last step: a second output, here a itself
    dst, also = torch.empty(n, dtype=dtype), a.clone()
    torch_mpi_gpu._C.reduce_step(dst, also, b.contiguous(), op, scale, also=also)
    if not (same_result(dst, expect, tight=False) and same_result(also, expect, tight=False)):
        failures.append(f"host {op} {dtype} n={n}, second output over a: {dst[:6]} / {also[:6]} vs {expect[:6]}")
    return failures


@pytest.mark.long_first(seconds=49)
def test_reduce_kernels_match_torch():
    # One process: our CUDA kernels for every reduce op x dtype against torch's ops. The copies
    # both ways are queued, not waited for, and each dtype's results read after one synchronize:
    # a wait per check cost ~10 ms each on the lent GPU with the other workers' processes on it
    # (48.7 s for ~4,500 of them, 2026-12-04), where the work itself takes microseconds.
    import torch_mpi_gpu

    def to_device(t):
        return t.pin_memory().cuda(non_blocking=True)

    def read_back(t):
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)

    failures, queued = [], []  # queued: (what, [host copies of results], expected)

    def compare_queued():
        torch.cuda.synchronize()
        for what, results, expect in queued:
            if not all(same_result(got, expect) for got in results):
                failures.append(f"{what}: {' / '.join(str(got[:6]) for got in results)} vs {expect[:6]}")
        queued.clear()

    last_dtype = None
    for op, dtype, n, shift, a, b, scale, expect in reduce_step_cases():
        if dtype != last_dtype:
            compare_queued()
            last_dtype = dtype
        da, db = to_device(a), to_device(b)
        dst = torch.empty(n + shift, dtype=dtype, device="cuda")[shift:]
        torch_mpi_gpu._C.reduce_step(dst, da, db, op, scale)
        queued.append((f"{op} {dtype} n={n} shift={shift}", [read_back(dst)], expect))
        # a second output in the same pass (the leader form's last step): apart, and over a
        for over_a in (False, True):
            dst2 = torch.empty(n + shift, dtype=dtype, device="cuda")[shift:]
            also = da.clone() if over_a else torch.empty_like(dst2)
            torch_mpi_gpu._C.reduce_step(dst2, also if over_a else da, db, op, scale, also=also)
            queued.append((f"{op} {dtype} n={n} shift={shift}, second output "
                           f"{'over a' if over_a else 'apart'}", [read_back(dst2), read_back(also)],
                           expect))
        # the host reducer must agree with the same reference
        failures += host_reducer_failures(op, dtype, n, a, b, scale, expect)
    compare_queued()
    assert not failures, "\n".join(failures[:40])


# Our algorithms on CUDA tensors, each forced, with device-pointer messages (CUDA-aware MPI) and
# with pinned staging; 4 KiB messages so the 1000-element cases pipeline.
ALGO_CASES = [("ring", 2), ("ring", 3), ("rhd", 3), ("allgather", 3)]


@pytest.mark.parametrize("transport", ["device", "staged"])
@pytest.mark.parametrize("algo,np", ALGO_CASES)
def test_algorithms_cuda(algo, np, transport):
    env = {"MPIGPU_TEST_DEVICE": "cuda", "TORCH_MPIGPU_ALGO": algo,
           "TORCH_MPIGPU_ALGO_PIECE_BYTES": "4096"}
    if transport == "device":
        env.update(path_env("direct"))
    else:
        env.update({"TORCH_MPIGPU_CUDA_REDUCE": "staged"})
    out = run_mpi("collectives.py", np, env=env)
    assert passed_counts(out, np, COLLECTIVES | {FORCED_ALGORITHM}) > 1500


@pytest.mark.parametrize("path", ["direct", "staged", "hybrid"])
@pytest.mark.parametrize("np", [2, 3, 4])
def test_collectives_cuda(path, np):
    out = run_mpi("collectives.py", np, env={"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)})
    assert passed_counts(out, np, COLLECTIVES) > 1500


@pytest.mark.parametrize("path", ["direct", "staged"])
@pytest.mark.parametrize("np", [2, 3])
def test_p2p_groups_cuda(path, np):
    out = run_mpi("p2p_groups.py", np, env={"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)})
    assert passed_counts(out, np, p2p_groups_behaviours(np)) > 30


# hybrid (the default): all_gather and the large reductions through auto's node algorithm, whose
# CUDA IPC slots must wait for the caller's busy producer stream like the paths do
@pytest.mark.parametrize("path, np", [("direct", 2), ("direct", 3), ("staged", 2), ("staged", 3),
                                      ("hybrid", 2), ("hybrid", 3), ("hybrid", 4)])
def test_stream_ordering(path, np):
    out = run_mpi("cuda_streams.py", np, env={"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)})
    assert passed_counts(out, np, cuda_streams_behaviours(np)) >= 7


# The random differential soak on CUDA tensors (#24): each path and forced algorithms at 2-4 ranks
# on the one GPU, and mixed CUDA/CPU ranks; the thresholds lowered so sizes either side of each
# stay small. 600 cases a run, 6,000 in all. hybrid (the default) takes auto's node algorithm
# (the leader form) for all_gather, all_reduce from NODE_SHARED_GPU_ALLREDUCE_BYTES and
# reduce_scatter from ALGO_MIN_BYTES; direct and staged do not.
SOAK_THRESHOLDS = {"TORCH_MPIGPU_ALGO_MIN_BYTES": "65536",
                   "TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES": "24576",
                   "TORCH_MPIGPU_CUDA_DIRECT_BYTES": "32768",
                   "TORCH_MPIGPU_STAGING_CHUNK_BYTES": "16384", "TORCH_MPIGPU_ALGO_PIECE_BYTES": "8192"}
SOAK_RUNS = {
    "direct, 2 ranks": (2, "direct", {}), "direct, 3 ranks": (3, "direct", {}),
    "direct, 4 ranks": (4, "direct", {}), "staged, 3 ranks": (3, "staged", {}),
    "hybrid, 2 ranks": (2, "hybrid", {}), "hybrid, 4 ranks": (4, "hybrid", {}), "ring forced, 3 ranks": (3, "hybrid", {"TORCH_MPIGPU_ALGO": "ring"}),
    "rhd forced, 4 ranks": (4, "staged", {"TORCH_MPIGPU_ALGO": "rhd"}),
    "mixed CUDA/CPU, 2 ranks": (2, None, {}), "mixed CUDA/CPU, 3 ranks": (3, None, {}),
}


@pytest.mark.parametrize("run", SOAK_RUNS)
def test_device_soak(run):
    np, path, extra = SOAK_RUNS[run]
    device = {"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)} if path else {"MPIGPU_TEST_DEVICE": "mixed"}
    env = {**device, **SOAK_THRESHOLDS, **extra, "MPIGPU_RANDOM_CASES": "600"}
    out = run_mpi("device_soak.py", np, env=env, timeout=600)
    assert passed_counts(out, np, {"random cases against the CPU reference"}) >= 600


def cuda_streams_behaviours(np):
    every = {"collectives issued while the producer runs", "Work.wait() orders another stream",
             "the future orders another stream", "8 async ops in flight from a busy stream",
             "an op inside a CUDA graph capture is refused"}
    return every | ({"send/recv from a busy stream"} if np > 1 else set())


# Staged, with MPI's own reductions: the CUDA rank pipelines all_reduce, reduce and broadcast in
# 4 KiB pieces, so the CPU ranks must cut the same (agreed when the group is made).
MIXED_STAGED = {"TORCH_MPIGPU_CUDA_AWARE": "0", "TORCH_MPIGPU_STAGING_CHUNK_BYTES": "4096",
                "TORCH_MPIGPU_ALGO": "mpi"}


@pytest.mark.parametrize("np, env", [(2, {}), (3, {}), (3, MIXED_STAGED)])
def test_mixed_cuda_and_cpu_ranks(np, env):
    # rank 0's tensors on CUDA, the others' on CPU, in the same collectives
    out = run_mpi("collectives.py", np, env={"MPIGPU_TEST_DEVICE": "mixed", **env})
    assert passed_counts(out, np, COLLECTIVES) > 1500
    if env:
        return
    # fused buckets: a CUDA rank and a CPU rank cut the same ones (FUSE_BELOW_BYTES)
    out = run_mpi("fusion.py", np, env={"MPIGPU_TEST_DEVICE": "mixed"})
    assert passed_counts(out, np, fusion_behaviours(np)) >= 20


def test_own_device_cuda_and_cpu_ranks_in_one_collective(own_device_env):
    # ranks 0, 1, 2 on the tests' own device (via-cpu), CUDA and CPU, in the same collectives;
    # the CUDA rank then sits in a group with a GPU beside a rank of another accelerator
    out = run_mpi("collectives.py", 3, env={"MPIGPU_TEST_DEVICE": "own-cuda-cpu", **own_device_env})
    assert passed_counts(out, 3, COLLECTIVES) > 1500
    for rank, where in enumerate(("owndev:0", "cuda:", "cpu")):
        assert f"[rank {rank}/3] collectives(np=3, device={where}" in out, out[-3000:]


def test_split_groups_and_device_mesh_bound_to_cuda():
    # init_process_group(device_id=cuda:N), as torch advises for GPUs: DeviceMesh and
    # split_group then split the default group (CPU CI runs this on the tests' own device)
    out = run_mpi("split_groups.py", 4, env={"MPIGPU_TEST_DEVICE": "cuda"})
    assert passed_counts(out, 4, split_groups_behaviours(4)) >= 25


# How the ranks of the one GPU wait for each other in the device slots: auto orders from the
# host (they share the GPU); device flags are forced, correct but slow here (each barrier waits
# for the other processes' time slices).
NODE_ORDER = {"auto": "ordered from the host: ranks of the node share a GPU",
              "device": "ordered on the device by flags (TORCH_MPIGPU_NODE_DEVICE_ORDER=device)"}


# (3 ranks ordered from the host run as 2 + 1 pretended nodes: the hierarchical path on device
# slots, MPI between the nodes, in lanes as where nodes hold different counts). One node ordered
# from the host: auto takes the leader form (NODE_LEADER: the node's first rank reduces for all,
# fewer switches between the ranks' time slices); `0` keeps one-shot and two-shot covered there.
@pytest.mark.long_first(seconds=30)
@pytest.mark.parametrize("np, order, shape, leader", [
    (2, "auto", "1 node x 2 ranks", "auto"),
    (3, "auto", "1 node x 3 ranks", "0"),
    (3, "auto", "2 nodes of 1 to 2 ranks (not uniform), across nodes in 1 lane", "auto"),
    (2, "device", "1 node x 2 ranks", "auto"),
    (3, "device", "1 node x 3 ranks", "auto")],
    ids=["2-auto-leader", "3-auto-no-leader", "3-auto-2+1-nodes", "2-device", "3-device"])
def test_node_algorithm_cuda(np, order, shape, leader):
    # the node algorithm on CUDA tensors: device slots mapped into the peers by CUDA IPC; 64 KiB
    # slots, so most ops go in pieces. Unavailable IPC would run the ring, and the
    # forced-algorithm check would fail.
    env = {"MPIGPU_TEST_DEVICE": "cuda", "TORCH_MPIGPU_ALGO": "node",
           "TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES": "65536", "MPIGPU_EXPECT_NODES": shape,
           "TORCH_MPIGPU_NODE_DEVICE_ORDER": order, "TORCH_MPIGPU_NODE_LEADER": leader}
    if "nodes of" in shape:  # (the lone rank's node orders itself by flags: a GPU of its own)
        env["TORCH_MPIGPU_TEST_PRETEND_NODES"] = "2"
    else:
        env["MPIGPU_EXPECT_ORDER"] = NODE_ORDER[order]
        env["MPIGPU_EXPECT_LEADER"] = "1" if order == "auto" and leader == "auto" else "0"
    out = run_mpi("collectives.py", np, env=env, timeout=600)
    assert passed_counts(out, np, COLLECTIVES | {"the group's nodes", FORCED_ALGORITHM}) > 1500
    assert "no device slots" not in out, out[-3000:]


@pytest.mark.parametrize("np", [2, 3])
def test_auto_takes_the_leader_form_on_a_shared_gpu(np):
    # auto's choice for CUDA tensors where the ranks share the GPU (Algorithms.cpp: nodePicks):
    # the node algorithm's leader form for all_gather at any size, all_reduce from
    # NODE_SHARED_GPU_ALLREDUCE_BYTES and reduce_scatter from ALGO_MIN_BYTES, MPI's own just below
    # and for broadcast; results against the CPU reference
    out = run_mpi("auto_algorithm.py", np, timeout=300)
    assert passed_counts(out, np, AUTO_ON_GPU) >= 20


@pytest.mark.long_first(seconds=82)
@pytest.mark.parametrize("order", ["auto", "device"])
def test_ddp_and_fsdp2_through_the_node_algorithm_cuda(order):
    # training through the CUDA IPC slots, ordered from the host (auto: the ranks share the GPU)
    # and by device flags; each must match its single-process reference
    env = {"MPIGPU_TEST_DEVICE": "cuda", "TORCH_MPIGPU_ALGO": "node", "MPIGPU_EXPECT_RAN": "node",
           "TORCH_MPIGPU_NODE_DEVICE_ORDER": order}
    ran = {"the expected algorithm ran"}
    out = run_mpi("ddp.py", 2, env=env, timeout=600)
    assert passed_counts(out, 2, DDP | ran) >= 60
    out = run_mpi("fsdp.py", 2, env=env, timeout=600)
    assert passed_counts(out, 2, (FSDP - {"FSDP2 mpigpu matches gloo"}) | ran) >= 6


@pytest.mark.long_first(seconds=49)
def test_node_algorithm_cuda_without_ipc_falls_back():
    # device slots that cannot be made (a 1 TiB cudaMalloc fails here as a blocked CUDA IPC
    # would): one warning naming why, and every op through the ring, still right
    env = {"MPIGPU_TEST_DEVICE": "cuda", "TORCH_MPIGPU_ALGO": "node",
           "TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES": str(1 << 40), "MPIGPU_EXPECT_RAN": "ring"}
    out = run_mpi("collectives.py", 2, env=env)
    assert passed_counts(out, 2, COLLECTIVES | {"the expected algorithm ran"}) > 1500
    assert "no device slots for the node algorithm (cudaMalloc(" in out, out[-3000:]


@pytest.mark.parametrize("probe", ["passed", "failed"])
def test_cuda_awareness_probe(probe):
    # where the library reports CUDA support, the first group checks device buffers; a failed
    # check (forced here) stages CUDA tensors, with a warning that says what to set
    if not auto_cuda_path().startswith("cuda-direct"):
        skip_or_fail("not-cuda-aware", f"the probe runs only where the MPI reports CUDA support "
                     f"({auto_cuda_path()})")
    env = {"MPIGPU_EXPECT_PROBE": probe, "TORCH_MPIGPU_CUDA_AWARE": "auto",
           **({"TORCH_MPIGPU_TEST_CUDA_PROBE_FAILS": "1"} if probe == "failed" else {})}
    out = run_mpi("cuda_probe.py", 2, env=env)
    assert passed_counts(out, 2, {"the probe's exchanges and agreement, host buffers",
                                  "the probe at the first group with a GPU"}) >= 7
    warned = "device buffers came back wrong in mpigpu's probe" in out
    assert warned == (probe == "failed"), out[-3000:]
    if warned:
        assert "TORCH_MPIGPU_CUDA_AWARE=1 forces them" in out, out[-3000:]


@pytest.mark.long_first(seconds=36)
@pytest.mark.parametrize("path", ["direct", "staged", "hybrid"])
def test_ddp_cuda(path):
    out = run_mpi("ddp.py", 2, env={"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)})
    assert passed_counts(out, 2, DDP) >= 60


@pytest.mark.parametrize("mode", ["destroy", "abort"])
def test_ending_a_group_with_a_stuck_cuda_op(mode):
    # as test_reliability's CPU case, with the stuck all_reduce on the group's CUDA streams
    check_ending_a_group_with_a_stuck_op(mode, "cuda")
