"""Real multi-rank jobs under mpirun: every op, reduce op and dtype at 1-4 ranks, compared with
references computed independently on each rank (see tests/mp/)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import conftest
from conftest import LAUNCHER, ROOT, SERIALIZED, SRUN_MPI, mpirun_path, is_hydra, passed_counts, require_library

# The two simulated hosts share this machine's 2 cores: each core carries two ranks bound to it,
# one per "host", which a rank cannot see (its affinity says one core of its own), so under the
# default a waiting rank spins and takes the core from the other host's rank (collectives.py at
# 2 x 2: 20 s of sections spinning, 1.6 s yielding). These jobs test the ops across hosts, so
# their ranks yield as ranks on cores of their own would cost nothing; test_hang_prone keeps the
# default (#25's conditions: bound and spinning).
SHARED_CORES_ENV = {"TORCH_MPIGPU_MPI_YIELD": "1"} if LAUNCHER.startswith("two-hosts") else {}


def run_mpi(script, np, env=None, **kwargs):
    return conftest.run_mpi(script, np, env={**SHARED_CORES_ENV, **(env or {})}, **kwargs)


RANKS = [1, 2, 3, 4]

# The behaviours (Checker sections) each script must report from every rank; a section that
# stops running, or runs no check, fails by name.
COLLECTIVES = {"reductions: every op x dtype x size", "premul_sum with a tensor factor, 2-D tensors",
               "complex tensors", "sparse COO all_reduce",
               "all_gather and reduce_scatter with blocks of different sizes", "many tensors in one call, coalescing manager",
               "data movement: every op x dtype x size",
               "coalesced all_gather_into_tensor / reduce_scatter_tensor", "objects and barrier",
               "non-contiguous tensors, every op", "collectives in subgroups"} | (
    {"all_gather_single / reduce_scatter_single"} if hasattr(dist, "all_gather_single") else set())
FORCED_ALGORITHM = "the forced algorithm ran"


DDP = {"default", "gradient_as_bucket_view", "static_graph", "small buckets",
       "no_sync accumulation", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
       "powerSGD_hook", "sparse embedding gradients"}
FSDP = {"device mesh on mpigpu", "FSDP2 fp32 matches one process", "FSDP2 mpigpu matches gloo",
        "FSDP2 bf16 mixed precision", "DTensor redistribute and reductions"}


ERRORS = set(conftest.script_constant("errors.py", "SECTIONS"))


def p2p_groups_behaviours(np):
    every = {"async_semantics", "groups", "threads", "device_mesh",
             "destroy and re-initialise in the same process"}
    return every | ({"p2p"} if np > 1 else set())


def fusion_behaviours(np):
    every = set(conftest.script_constant("fusion.py", "SECTIONS"))
    return every | ({conftest.script_constant("fusion.py", "BATCH_ISEND_IRECV")} if np > 1 else set())



def expected_launcher():
    if SRUN_MPI:
        return f"Slurm srun --mpi={SRUN_MPI}"
    # mpirun, or its place on the two hosts: the launcher of the MPI built against
    if is_hydra(mpirun_path()):
        return "MPICH/Hydra mpiexec"
    return "Open MPI mpirun"


@pytest.mark.parametrize("np", RANKS)
def test_launcher_sets_rank_local_rank_and_world_size(np):
    hosts = 2 if LAUNCHER.startswith("two-hosts") and np > 1 else 1
    out = run_mpi("launch_env.py", np, args=(expected_launcher(), str(hosts)))
    assert passed_counts(out, np) >= 7


def test_pmix_prterun_starts_ranks_and_a_dead_rank_ends_the_job():
    # PRRTE's own launcher (the README's table; Open MPI 5's mpirun runs on it): ranks, local
    # ranks and the rendezvous from PMIx alone, one collective per rank, and a killed rank
    # ending the job. The MPICH leg deselects it (no prterun there).
    from conftest import launch_env, rank_command
    prterun = Path(mpirun_path()).with_name("prterun")
    assert prterun.exists(), f"no prterun beside {mpirun_path()} (Open MPI 5 has it)"
    env = launch_env({"PRTE_ALLOW_RUN_AS_ROOT": "1", "PRTE_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})

    def prterun_job(script, *args):
        # (3 ranks on this 2-core VM: more than its slots)
        cmd = [str(prterun), "--map-by", ":OVERSUBSCRIBE", "-np", "3", *rank_command(script, *args)]
        proc = conftest.run_launcher(cmd, env, timeout=120)
        return proc.returncode, proc.stdout + proc.stderr, proc.seconds

    rc, out, _ = prterun_job("launch_env.py", "PMIx (prterun)", "1")
    assert rc == 0 and passed_counts(out, 3) >= 7, out[-3000:]
    rc, out, took = prterun_job("stall.py", "die")
    started = set(re.findall(r"\[rank (\d+)\] started at", out))
    assert started == {"0", "1", "2"} and rc != 0 and "unreachable" not in out, out[-3000:]
    assert took < 60, f"the job took {took:.0f} s to end after rank 1 was killed"


def test_prterun_at_a_reused_pid_starts_once_the_stale_session_folder_is_gone(tmp_path):
    # A CI run failed so at 520fd8e: an mpirun exited 213 at start ("The PMIx server's listener
    # thread failed to start"), its pid that of an mpirun killed earlier whose session folder
    # stayed. Replayed in a PID namespace of our own (pids chosen there, nobody else forking),
    # with the test's own TMPDIR: the stale folder stops the new mpirun, and conftest's cleanup
    # (run before every test) lets it start; so does torch_mpi_gpu's own launcher, which removes
    # the folder of its pid before it becomes mpirun. The MPICH leg deselects it (no prterun).
    # (Its name avoids the words the other legs select by: only the CPU leg runs it.)
    if LAUNCHER != "mpirun":
        pytest.skip("one host's launcher: the launch itself is the subject")
    assert Path(mpirun_path()).with_name("prterun").exists(), \
        f"no prterun beside {mpirun_path()}: Open MPI 5's session folders are the subject"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this user cannot make a PID namespace here: {probe.stderr.strip()}")
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                           str(conftest.MP_DIR / "killed_mpirun_pid.py"), mpirun_path()],
                          env=conftest.launch_env({"TMPDIR": str(tmp_path)}), cwd=conftest.MP_DIR,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    killed = re.findall(r"left by the killed mpirun \(pid (\d+)\): True", out)
    tries = re.findall(r"at pid (\d+): exit (\d+): (.*)", out)
    assert proc.returncode == 0 and len(killed) == len(tries) == 3, out
    (pid_stale, rc_stale, said), (pid_clean, rc_clean, _), (pid_ours, rc_ours, _) = tries
    assert [pid_stale, pid_clean, pid_ours] == killed, out
    assert rc_stale != "0" and "listener thread failed to start" in said, out
    assert rc_clean == "0", out
    assert rc_ours == "0", f"python -m torch_mpi_gpu.mpirun at a killed mpirun's pid:\n{out}"


def test_master_port_setting_is_the_store_port():
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    hosts = 2 if LAUNCHER.startswith("two-hosts") else 1
    out = run_mpi("launch_env.py", 2, env={"TORCH_MPIGPU_MASTER_PORT": str(port)},
                  args=(expected_launcher(), str(hosts)))
    assert passed_counts(out, 2) >= 8  # the launcher's checks and the port's


MPI_STORE = set(conftest.script_constant("mpi_store.py", "SECTIONS"))


def only_shared_memory_env():
    """Open MPI on one host: messages over shared memory only (`--mca btl self,sm`), so that MPI
    itself opens no TCP port either; elsewhere (MPICH, two hosts) MPI's own transports."""
    if LAUNCHER.startswith("two-hosts") or SRUN_MPI or is_hydra(mpirun_path()):
        return {}
    return {"OMPI_MCA_btl": "self,sm"}


@pytest.mark.parametrize("np", RANKS)
def test_mpi_store_rendezvous_opens_no_tcp_listener(np):
    # the default rendezvous under the launcher: every store call against HashStore, ranks
    # sharing it, timeouts and departures naming the key, groups, mesh, objects; no listener
    out = run_mpi("mpi_store.py", np, env=only_shared_memory_env(), args=("mpi",))
    assert passed_counts(out, np, MPI_STORE) >= 30


def test_mpi_store_rendezvous_with_one_shared_mpi_thread():
    # MPI_THREAD_SERIALIZED: the same default MPI store, no listener; rank 0's server answers
    # while its one engine thread waits (for ranks that first need a store reply). MPI_YIELD=0:
    # the arrivals come from the thread level alone, as on a host with a core per rank.
    out = run_mpi("mpi_store.py", 3, env={**SERIALIZED, **only_shared_memory_env(),
                                           "TORCH_MPIGPU_MPI_YIELD": "0"}, args=("serialized",))
    assert passed_counts(out, 3, MPI_STORE) >= 30


def test_tcp_rendezvous_control_listens_on_rank_0():
    # TORCH_MPIGPU_MASTER_PORT keeps torch's TCPStore: the listener check must see it
    from helpers import free_port
    out = run_mpi("mpi_store.py", 2, env={"TORCH_MPIGPU_MASTER_PORT": str(free_port())},
                  args=("tcp",))
    assert passed_counts(out, 2, set(conftest.script_constant("mpi_store.py", "TCP_SECTIONS")))


@pytest.mark.parametrize("np", RANKS)
def test_collectives(np):
    assert passed_counts(run_mpi("collectives.py", np), np, COLLECTIVES) > 1500


@pytest.mark.parametrize("np, device", [(2, "own"), (3, "own-mixed")])
def test_a_device_of_its_own_every_collective(np, device, own_device_env):
    # The via-cpu path with a real device that is neither CPU nor CUDA (tests/mp/own_device.py,
    # on torch's PrivateUse1): alone, and own-device ranks beside CPU ranks in one collective
    # own-mixed: the own-device rank 0 also cuts its pieces (above), which the CPU ranks follow
    pieces = ONE_RANK_PIECES if device == "own-mixed" else {}
    out = run_mpi("collectives.py", np,
                  env={"MPIGPU_TEST_DEVICE": device, **own_device_env, **pieces})
    assert passed_counts(out, np, COLLECTIVES | ({"one rank's pieces, cut by every rank"}
                                                 if pieces else set())) > 1500
    on_own = [r for r in range(np) if device == "own" or r % 2 == 0]
    for rank in range(np):
        where = "owndev:0" if rank in on_own else "cpu"
        assert f"[rank {rank}/{np}] collectives(np={np}, device={where}," in out, out[-3000:]
    if device == "own-mixed":  # and point-to-point, groups, threads, DeviceMesh between them
        out = run_mpi("p2p_groups.py", np, env={"MPIGPU_TEST_DEVICE": device, **own_device_env})
        assert passed_counts(out, np, p2p_groups_behaviours(np)) >= 40


def split_groups_behaviours(np):
    """The sections tests/mp/split_groups.py reports at np ranks."""
    return ({"split into even and odd ranks", "split with ranks listed high to low",
             "a rank in no child", "a split of a split", "new_group beside splits"}
            | ({"DeviceMesh 2-D through splits"} if np % 2 == 0 else set())
            | ({"split_ranks that differ between ranks"} if np >= 3 else set()))


@pytest.mark.parametrize("np", [3, 4])
def test_split_groups_and_device_mesh_with_a_bound_device(np, own_device_env):
    # torch splits groups (split_group; DeviceMesh, new_group's non-members) only where the
    # default group is bound to an accelerator: the tests' own device stands in for CUDA
    out = run_mpi("split_groups.py", np, env={"MPIGPU_TEST_DEVICE": "own", **own_device_env})
    assert passed_counts(out, np, split_groups_behaviours(np)) >= 25


SHRINK_BEHAVIOURS = set(conftest.script_constant("shrink.py", "SECTIONS"))


@pytest.mark.parametrize("np, level", [(3, "multiple"), (4, "multiple"), (3, "serialized")])
def test_shrink_group_leaves_the_excluded_ranks_out(np, level):
    # torch's shrink_group: only the ranks that stay take part (one rank out at 3, two at 4), and
    # after the default group shrinks torch's global ranks are renumbered; below
    # MPI_THREAD_MULTIPLE the aborted group and the shrunk one share the one MPI thread
    if not hasattr(dist, "shrink_group"):
        conftest.skip_or_fail("torch-version", f"torch {torch.__version__} has no shrink_group (2.10+)")
    out = run_mpi("shrink.py", np, env=SERIALIZED if level == "serialized" else {})
    assert passed_counts(out, np, SHRINK_BEHAVIOURS) >= 4


def test_collectives_split_into_small_mpi_calls():
    # Every message above 5 elements is split: exercises the >2^31 element code paths cheaply.
    # (all_reduce by the node algorithm at every size: MPI's own, auto's choice from 16 KiB, would
    # make a 1 MiB op 50,000 MPI calls, 2.5 minutes of CI; test_collectives_with_mpis_own_algorithm
    # runs MPI's own)
    out = run_mpi("collectives.py", 3, env={"TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL": "5",
                                            "TORCH_MPIGPU_NODE_HOST_MPI_FROM_BYTES": str(1 << 40)})
    assert passed_counts(out, 3, COLLECTIVES) > 1500


# Our reduction algorithms forced on host tensors (TORCH_MPIGPU_ALGO), with 64-byte messages so
# every size above 16 floats is cut into pieces that pipeline. (`node` is what auto picks on one
# host, so the plain tests above run it; MPI's own reductions are forced below.)
ALGOS = ["ring", "rhd", "allgather"]


def algo_env(algo):
    return {"TORCH_MPIGPU_ALGO": algo, "TORCH_MPIGPU_ALGO_PIECE_BYTES": "64"}


AUTO_ALGORITHM = {"fp16/bf16 all_reduce: the ring from HOST_HALF_RING_BYTES",
                  "reduce_scatter: the ring from HOST_RS_RING_BYTES (fp16/bf16 from HOST_HALF_RING)",
                  "reduce: MPI's own"}
NO_NODE = {"TORCH_MPIGPU_NODE_BUFFER_BYTES": "0"}
# every rank a node of its own: the group spans nodes, and the node algorithm has nothing to share
NODE_EACH = {"TORCH_MPIGPU_TEST_PRETEND_NODES": "3"}
# 3 + 2 ranks: nodes holding different counts (auto's threshold across nodes lowered to 8 KiB)
NODES_UNEVEN = {"TORCH_MPIGPU_TEST_PRETEND_NODES": "2", "TORCH_MPIGPU_NODE_ACROSS_MIN_BYTES": "8192"}


# rank 0's pid names its segment; a killed job's segment of that name left in /dev/shm (CI met
# one: that group fell back with "shm_open(...): File exists") must not keep the node algorithm off
STALE_NAME = {"MPIGPU_TEST_STALE_SEGMENT": "1"}


# auto where the ranks have GPUs (every rank on one GPU, as on the lent machine: the node
# algorithm's leader form for CUDA tensors, tests/mp/auto_algorithm.py: shared_gpu)
AUTO_ON_GPU = {"a member has a GPU: MPI's own below ALGO_MIN_BYTES, then the ring",
               "CUDA tensors on a GPU the ranks share: the node algorithm's leader form for "
               "all_gather, all_reduce from NODE_SHARED_GPU_ALLREDUCE_BYTES, reduce_scatter from "
               "ALGO_MIN_BYTES"}


@pytest.mark.parametrize("np, env", [(1, {}), (2, NO_NODE), (3, NO_NODE), (2, {}), (3, {}),
                                     (3, NODE_EACH), (3, STALE_NAME), (5, NODES_UNEVEN)])
def test_auto_algorithm_choice_at_its_thresholds(np, env):
    out = run_mpi("auto_algorithm.py", np, env=env)
    gpu = (AUTO_ON_GPU if np > 1 and env in ({}, STALE_NAME)
           else {"a member has a GPU: MPI's own below ALGO_MIN_BYTES, then the ring"})
    node = {"ranks sharing a node: the node algorithm for reductions, all_gather and broadcast"}
    fp32 = ("fp32 all_reduce across nodes: the ring from HOST_ACROSS_RING_BYTES" if env is NODE_EACH
            else "fp32 all_reduce inside one node: MPI's own at any size")
    uneven = {"nodes holding different counts: the node algorithm for every op from NODE_ACROSS_MIN_BYTES"}
    want = (gpu if torch.cuda.is_available() else node if np > 1 and env in ({}, STALE_NAME)
            else uneven if env is NODES_UNEVEN else AUTO_ALGORITHM | {fp32})
    assert passed_counts(out, np, want) >= 2
    assert "no shared-memory segment" not in out, out[-3000:]


# Rank 0 alone cuts all_reduce/reduce/broadcast into 24-byte MPI calls, as a rank whose GPU
# tensors are staged does (TORCH_MPIGPU_TEST_HOST_PIECE_BYTES): the others must cut the same
# pieces, or MPI's collectives see mismatched counts (MPI_ERR_TRUNCATE here, a hang elsewhere).
ONE_RANK_PIECES = {"MPIGPU_TEST_HOST_PIECES_ON_RANK0": "24"}


# Rank 0 alone crowded (a host with more ranks than cores beside hosts with a core per rank; 5
# ranks on two 2-core hosts, 3 + 2, hung at start): MPI's own collectives, each of which begins
# with an arrival barrier on crowded hosts, and the node algorithm's barriers.
ONLY_RANK0_CROWDED = {"MPIGPU_TEST_ONLY_RANK0_CROWDED": "1"}


def test_collectives_where_ranks_differ_in_crowding():
    out = run_mpi("collectives.py", 3, env={"TORCH_MPIGPU_ALGO": "mpi", **ONLY_RANK0_CROWDED})
    assert passed_counts(out, 3, COLLECTIVES | {"ranks that differ in crowding"}) > 1500
    out = run_mpi("collectives.py", 3, env={"TORCH_MPIGPU_ALGO": "node", **ONLY_RANK0_CROWDED})
    assert passed_counts(out, 3, COLLECTIVES | {"ranks that differ in crowding", FORCED_ALGORITHM}) > 1500


@pytest.mark.parametrize("np, env", [(2, {}), (3, ONE_RANK_PIECES)])
def test_collectives_with_mpis_own_algorithm(np, env):
    out = run_mpi("collectives.py", np, env={"TORCH_MPIGPU_ALGO": "mpi", **env})
    want = COLLECTIVES | ({"one rank's pieces, cut by every rank"} if env else set())
    assert passed_counts(out, np, want) > 1500


# The node algorithm in its shapes: pieces much smaller than the ops (4 KiB per rank and half:
# every size above 1024 floats is chunked; one-shot off or always), and nodes pretended on this
# host so the hierarchical path runs (uniform 2 x 2 and 2 x 3; nodes of different counts, 3 + 2
# and 2 + 1 + 1: every op in as many lanes as the smallest node has ranks, a broadcast in one lane
# (from a root above the lanes through its node first), and the description says so). all_gather
# through the slots (single copy never) or by reading the peers in place (single copy at every
# size: the cases here are small; 2 x 3 and 3 + 2), and
# the group falling back as one where one rank's probe fails.
# id: nodes x ranks per node; (np, settings, the description)
SLOTS_ONLY = {"TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES": str(1 << 40), "MPIGPU_EXPECT_SINGLE_COPY_READS": "none"}
SINGLE_COPY = {"TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES": "0", "MPIGPU_EXPECT_SINGLE_COPY_READS": "some",
               "MPIGPU_EXPECT_SINGLE_COPY": "single copy (process_vm_readv) for all_gather from 0 bytes"}
NODE_SHAPES = {
    "1x3-4KiB-pieces-two-shot": (3, {"TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096",
                                     "TORCH_MPIGPU_NODE_ONE_SHOT_BYTES": "0", **SLOTS_ONLY},
                                 "1 node x 3 ranks"),
    "1x4-one-shot-at-any-size-single-copy": (4, {"TORCH_MPIGPU_NODE_ONE_SHOT_BYTES": str(1 << 40),
                                                 **SINGLE_COPY}, "1 node x 4 ranks"),
    "1x3-single-copy-refused-on-rank-0": (3, {**SINGLE_COPY, "MPIGPU_TEST_NO_SINGLE_COPY_ON_RANK0": "1",
                                              "MPIGPU_EXPECT_SINGLE_COPY_READS": "none",
                                              "MPIGPU_EXPECT_SINGLE_COPY": "single copy unavailable: "},
                                          "1 node x 3 ranks"),
    "2x2-4KiB-pieces": (4, {"TORCH_MPIGPU_TEST_PRETEND_NODES": "2",
                            "TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096", **SLOTS_ONLY}, "2 nodes x 2 ranks"),
    "2x3-single-copy": (6, {"TORCH_MPIGPU_TEST_PRETEND_NODES": "2", **SINGLE_COPY}, "2 nodes x 3 ranks"),
    "3+2-two-lanes-single-copy": (5, {"TORCH_MPIGPU_TEST_PRETEND_NODES": "2", "TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096",
                                      **SINGLE_COPY},
                      "2 nodes of 2 to 3 ranks (not uniform), across nodes in 2 lanes"),
    # the leader form (one-node all_reduce and reduce_scatter reduced by the node's first rank,
    # its peers copying in and out; all_gather's rows placed by the peers first): forced on host
    # slots, and auto's choice in device slots ordered from the host (ranks sharing a GPU), here
    # the device-slot code on host memory
    "1x3-leader-form-4KiB-pieces": (3, {"TORCH_MPIGPU_NODE_LEADER": "1",
                                           "TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096",
                                           "MPIGPU_EXPECT_LEADER": "1", **SLOTS_ONLY}, "1 node x 3 ranks"),
    "device-slot-code-on-host-1x4-host-order-leader-form": (4, {"TORCH_MPIGPU_TEST_DEVICE_SLOTS": "1",
                                                           "TORCH_MPIGPU_NODE_DEVICE_ORDER": "host",
                                                           "TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES": "4096",
                                                           "TORCH_MPIGPU_NODE_DEVICE_BUFFER_MAX_BYTES": "8192",
                                                           "MPIGPU_EXPECT_SLOTS": "device slots 8192 bytes per "
                                                           "rank and half (grown from 4096, at most 8192)",
                                                           "MPIGPU_EXPECT_ORDER": "ordered from the host",
                                                           "MPIGPU_EXPECT_LEADER": "1"},
                                                       "1 node x 4 ranks"),
    "2+1+1-one-lane": (4, {"TORCH_MPIGPU_TEST_PRETEND_NODES": "3", "TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096"},
                       "3 nodes of 1 to 2 ranks (not uniform), across nodes in 1 lane"),
    # the device-slot code (what the CUDA IPC slots run) on host memory, hierarchical, 4 KiB
    # slots grown once to 8 KiB (larger ops still in pieces), ordered by the slots' own barrier
    # where device flags would order them
    "device-slot-code-on-host-2-nodes": (4, {"TORCH_MPIGPU_TEST_PRETEND_NODES": "2",
                                             "TORCH_MPIGPU_TEST_DEVICE_SLOTS": "1",
                                             "TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES": "4096",
                                             "TORCH_MPIGPU_NODE_DEVICE_BUFFER_MAX_BYTES": "8192",
                                             "MPIGPU_EXPECT_SLOTS": "device slots 8192 bytes per "
                                             "rank and half (grown from 4096, at most 8192)",
                                             "TORCH_MPIGPU_NODE_DEVICE_ORDER": "device",
                                             "MPIGPU_EXPECT_ORDER": "ordered by the slots themselves",
                                             "MPIGPU_EXPECT_LEADER": "0"},
                                         "2 nodes x 2 ranks"),
}


def node_collectives(np, env, shape):
    env = {**env, "MPIGPU_EXPECT_NODES": shape, "TORCH_MPIGPU_ALGO": "node"}
    out = run_mpi("collectives.py", np, env=env)
    behaviours = COLLECTIVES | {"the group's nodes", FORCED_ALGORITHM}
    assert passed_counts(out, np, behaviours) > 1500


@pytest.mark.parametrize("shape", NODE_SHAPES)
def test_collectives_with_node_algorithm(shape):
    np, env, described = NODE_SHAPES[shape]
    node_collectives(np, env, described)


@pytest.mark.parametrize("np, placement", [(2, "same"), (3, "same"), (2, "apart")])
def test_node_barrier_yields_to_a_peer_on_its_cpu(np, placement):
    # Unbound ranks that the scheduler puts on one CPU: the waiting rank must hand the CPU over
    # at once (before: a full spin per barrier, 130-190 us an op on 2 cores)
    if LAUNCHER.startswith("two-hosts"):
        pytest.skip("the placement is one node's; the hosts' legs run the node algorithm elsewhere")
    if placement == "apart" and len(os.sched_getaffinity(0)) < np:
        pytest.skip(f"'apart' needs {np} CPUs")
    behaviours = {"node collectives on the placement", f"waits for a peer on this CPU ({placement})"}
    assert passed_counts(run_mpi("shared_cpu.py", np, args=(placement,)), np, behaviours) >= 200


def test_node_with_a_rank_in_a_pid_namespace_of_its_own():
    # a container of its own on the node (same host name and /dev/shm, its own process table):
    # peers' pids mean nothing there, so no false "exited" report and no single copy by pid
    if LAUNCHER.startswith("two-hosts"):
        pytest.skip("one node's layout; the hosts' legs run the node algorithm elsewhere")
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this user cannot make a PID namespace here: {probe.stderr.strip()}")
    out = run_mpi("pid_namespace.py", 3, env={"TORCH_MPIGPU_ALGO": "node"})
    assert passed_counts(out, 3, {"a rank in a PID namespace of its own"}) >= 6


@pytest.mark.parametrize("all_gather", ["slots", "single-copy"])
def test_collectives_node_across_the_hosts_as_placed(all_gather):
    # 4 ranks as the launcher places them: one host (1 x 4), or the two simulated hosts (2 x 2,
    # ranks 0 and 2 on one host: hierarchical with non-consecutive members), 4 KiB pieces;
    # all_gather inside each host through the slots or by reading the peers in place
    two_hosts = LAUNCHER.startswith("two-hosts")
    node_collectives(4, {"TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096",
                         **(SLOTS_ONLY if all_gather == "slots" else SINGLE_COPY)},
                     "2 nodes x 2 ranks" if two_hosts else "1 node x 4 ranks")


def test_collectives_node_across_hosts_holding_different_counts():
    # 5 ranks on the two simulated 2-core hosts: 3 + 2 (mpirun by node: ranks 0, 2 and 4 on one
    # host; srun by block), so one host is crowded and the other not (this job hung at start when
    # only the crowded ranks began collectives with an arrival barrier); all_reduce and reduce in
    # two lanes across the hosts, 4 KiB pieces
    if not LAUNCHER.startswith("two-hosts"):
        pytest.skip("one host holds all 5 ranks (pretended nodes: test_collectives_with_node_algorithm)")
    node_collectives(5, {"TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096"},
                     "2 nodes of 2 to 3 ranks (not uniform), across nodes in 2 lanes")


def test_settings_every_rank_must_share_are_compared_when_a_group_is_made():
    # one rank's TORCH_MPIGPU_ALGO (default group) or FUSION_BYTES (subgroup) differing: every
    # rank's creation raises, naming the setting, each value and its ranks; a setting each rank
    # keeps its own may differ; with the values made equal, the groups are made and work
    out = run_mpi("settings_agreement.py", 3)
    assert passed_counts(out, 3, {
        "the default group with a shared setting differing",
        "the default group, the setting then the same",
        "a subgroup with a shared setting differing",
        "a subgroup, the setting then the same; one each rank keeps its own differing"}) >= 11


def test_cuda_awareness_probe_exchanges_and_agreement_on_host():
    # the probe's exchanges and agreement (mpi/DirectProbe.hpp) on host buffers; on a GPU,
    # test_gpu.py's test_cuda_awareness_probe runs it for real
    out = run_mpi("cuda_probe.py", 3)
    want = {"the probe's exchanges and agreement, host buffers"} | (
        set() if torch.cuda.is_available() else {"no group with a GPU: the probe has not run"})
    assert passed_counts(out, 3, want) >= 4


# The GPU soak's generator and CPU reference (#24), here on host tensors: edge sizes around the
# node algorithm's thresholds (lowered), views at offsets, send/recv rings; and with the ring.
@pytest.mark.parametrize("np, algo", [(3, "auto"), (3, "ring")])
def test_device_soak_generator_and_reference_on_cpu(np, algo):
    env = {"MPIGPU_RANDOM_CASES": "300", "TORCH_MPIGPU_ALGO": algo,
           "TORCH_MPIGPU_NODE_BUFFER_BYTES": "8192", "TORCH_MPIGPU_NODE_ONE_SHOT_BYTES": "2048",
           "TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES": "4096",
           "TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES": "6144",
           "TORCH_MPIGPU_ALGO_PIECE_BYTES": "4096"}
    out = run_mpi("device_soak.py", np, env=env)
    assert passed_counts(out, np, {"random cases against the CPU reference"}) >= 300


# (one rank: no messages, test_collectives[1]; rhd and allgather at 4 and 5 ranks: as at 2 and 3,
# rhd's folding of one extra rank at 3 and of several in test_rhd_folding_several_extra_ranks;
# the ring at 2, 3 and 5: its pattern has no case that 4 adds)
@pytest.mark.parametrize("algo, np", [(a, n) for a in ALGOS for n in (2, 3, 5)
                                      if n <= 3 or a == "ring"])
def test_collectives_with_algorithm(algo, np):
    out = run_mpi("collectives.py", np, env=algo_env(algo))
    assert passed_counts(out, np, COLLECTIVES | {FORCED_ALGORITHM}) > 1500


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("np", [2, 3])
def test_fusion_with_algorithm(algo, np):
    assert passed_counts(run_mpi("fusion.py", np, env=algo_env(algo)), np, fusion_behaviours(np)) >= 20


@pytest.mark.parametrize("np", [6, 7])
def test_rhd_folding_several_extra_ranks(np):
    # recursive halving/doubling folds the ranks above the largest power of two into partners:
    # 2 and 3 extra ranks here (3 ranks, one extra, run with the other algorithms)
    out = run_mpi("random_ops.py", np, env={"MPIGPU_RANDOM_CASES": "60", **algo_env("rhd")},
                  timeout=900)
    assert passed_counts(out, np) >= 60


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("np", [3, 4])
def test_random_ops_with_algorithm(algo, np):
    out = run_mpi("random_ops.py", np, env={"MPIGPU_RANDOM_CASES": "300", **algo_env(algo)},
                  timeout=900)
    assert passed_counts(out, np) >= 300


@pytest.mark.parametrize("np", RANKS)
def test_p2p_async_groups(np):
    assert passed_counts(run_mpi("p2p_groups.py", np), np, p2p_groups_behaviours(np)) > 30


# Receives from any source matched by probe (what auto picks on MPICH's ucx netmod, which loses
# posted ones): MPI's order of receives of one tag, no receive of another tag held back, on a
# thread of its own and on the one shared engine thread (held receives posted by the worker).
@pytest.mark.parametrize("np, env", [(2, {}), (3, SERIALIZED)])
def test_receives_from_any_source_matched_by_probe(np, env):
    out = run_mpi("p2p_groups.py", np, env={"TORCH_MPIGPU_ANY_SOURCE_RECV": "probe",
                                            "MPIGPU_EXPECT_ANY_SOURCE": "by matched probe", **env})
    assert passed_counts(out, np, p2p_groups_behaviours(np)) > 30


# Below MPI_THREAD_MULTIPLE every group of a process shares one engine thread, the only one in
# MPI (no inline posts, requests tested by the worker alone): the same suites on that path.
@pytest.mark.parametrize("np", [1, 3])
def test_collectives_with_one_shared_mpi_thread(np):
    assert passed_counts(run_mpi("collectives.py", np, env=SERIALIZED), np, COLLECTIVES) > 1500


@pytest.mark.parametrize("np", [2, 3])
def test_p2p_async_groups_with_one_shared_mpi_thread(np):
    out = run_mpi("p2p_groups.py", np, env=SERIALIZED)
    assert passed_counts(out, np, p2p_groups_behaviours(np)) > 30


def test_fusion_and_algorithms_with_one_shared_mpi_thread():
    out = run_mpi("fusion.py", 3, env={**SERIALIZED, **algo_env("ring")})
    assert passed_counts(out, 3, fusion_behaviours(3)) >= 20


@pytest.mark.parametrize("np", [2, 3])
def test_p2p_then_collectives_under_torch_debug_detail(np):
    out = run_mpi("debug_detail.py", np, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert passed_counts(out, np) >= 6


@pytest.mark.parametrize("np", [2, 3])
def test_p2p_stress_threads_and_timings(np):
    # every rank checks each of its 60 + 4 x 80 ring rounds, the 16 MiB message left in flight
    # and that every thread finished: exactly these, per behaviour
    want = {"ring rounds, one thread": 60, "16 MiB message left in flight": 1, "threads finish": 1,
            **{f"ring rounds, thread {t} of 4 ({'default group' if t < 2 else 'own group'})": 80
               for t in range(4)}}
    out = run_mpi("p2p_stress.py", np)
    assert passed_counts(out, np, set(want)) == sum(want.values())
    for rank in range(np):
        for name, count in want.items():
            assert f'[rank {rank}/{np}] behaviour "{name}": {count} passed, 0 failed' in out, \
                f"rank {rank}, {name!r}: not {count} checks passed\n{out[-3000:]}"


@pytest.mark.parametrize("np", RANKS)
def test_bad_arguments(np):
    assert passed_counts(run_mpi("errors.py", np), np, ERRORS) >= 17


def test_mpi_error_inside_a_collective_names_the_op_and_group():
    # MPI_ERR_TRUNCATE inside MPI_Alltoallv on rank 1: before, the error named the op and rank
    # but not which collective of which group
    assert passed_counts(run_mpi("mpi_error.py", 2), 2) >= 1


COMM_GROUPS = {"two ensembles by Split, interleaved", "errors",
               "a communicator in reverse rank order, and a subgroup from it"}


@pytest.mark.parametrize("np, level", [(3, "multiple"), (4, "multiple"), (4, "serialized")])
def test_groups_over_a_programs_communicator(np, level):
    # torch_mpi_gpu.init_process_group(comm=) / new_group(comm=) against what mpi4py says; below
    # MPI_THREAD_MULTIPLE their MPI calls go through the one shared MPI thread
    env = SERIALIZED if level == "serialized" else {}
    assert passed_counts(run_mpi("comm_groups.py", np, env=env), np, COMM_GROUPS) == 20


COMM_CAP = {"a group holds only the communicators it needs"}


@pytest.mark.parametrize("np, pretend_nodes, per_group, make", [
    (3, 1, 2, 1100),  # one node: the group's own and its algorithms'; then past MPICH's cap
    (4, 2, 4, 0),     # 2 nodes x 2: also the node's and the cross-node one
    (4, 4, 2, 0),     # a rank per node: neither (the group is the cross-node communicator)
], ids=["1x3-past-the-cap", "2x2", "4x1"])
def test_groups_hold_few_mpi_comms_and_a_refused_one_says_why(np, pretend_nodes, per_group, make):
    # MPICH and the MPIs built on it let a process hold 2048 communicators; a group used to hold 3
    # on one node (MPICH refused the 681st group, saying "the job should be restarted"). One host,
    # its shape set by pretend nodes (the two-host legs' placement would change the counts).
    # (4 KiB node slots: with the default 1 MiB, 1100 groups of 3 ranks reserve 6.6 GiB of /dev/shm)
    env = {"TORCH_MPIGPU_TEST_PRETEND_NODES": str(pretend_nodes), "TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096",
           "MPIGPU_EXPECT_COMMS_PER_GROUP": str(per_group), "MPIGPU_MAKE_GROUPS": str(make)}
    want = COMM_CAP | ({"more groups than MPI allows"} if make else set())
    out = run_mpi("comm_cap.py", np, env=env)
    assert passed_counts(out, np, want) >= 2
    print("\n".join(line for line in out.splitlines() if "groups made" in line))


def test_the_first_use_benchmark_times_every_step_on_host_tensors():
    # benchmarks/first_use_cost.py (gpu_check.sh runs it on the lent GPU): every step timed and
    # printed by rank 0, the results right
    out = run_mpi(str(ROOT / "benchmarks" / "first_use_cost.py"), 2, args=("--device", "cpu", "--mib", "1"))
    for step in ("import torch_mpi_gpu", "init_process_group", "first all_reduce, 4 B",
                 "second all_reduce, 1 MiB", "DDP model made", "second DDP training step"):
        assert re.search(rf"^{re.escape(step)} +\d+\.\d{{3}} +\d+\.\d{{3}}$", out, re.M), out[-3000:]
    assert re.search(r"^in all, rank 0 +\d+\.\d{3}$", out, re.M) and "WRONG" not in out, out[-3000:]


def test_ensembles_example_trains_each_member_like_one_process():
    # examples/ensembles.py: 2 members x 2 ranks, each its own default group and DDP model,
    # each equal to its own single-process reference; the members' models differ
    out = run_mpi(str(ROOT / "examples" / "ensembles.py"), 4)
    firsts = []
    for m in (0, 1):
        line = re.search(rf"member {m} \(world ranks \[{m}, {m + 2}\]\): 20 DDP steps on 2 ranks, "
                         r"parameters equal to its single-process reference .*first weight (\S+)",
                         out)
        assert line, out[-3000:]
        firsts.append(float(line.group(1)))
    assert firsts[0] != firsts[1], out[-3000:]


@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_ddp_matches_single_process(np):
    assert passed_counts(run_mpi("ddp.py", np), np, DDP) >= 60


@pytest.mark.parametrize("np", RANKS)
def test_fusion_one_mpi_call_per_bucket(np):
    assert passed_counts(run_mpi("fusion.py", np), np, fusion_behaviours(np)) >= 20


@pytest.mark.parametrize("np", [2, 3, 4])
def test_fsdp2_and_dtensor(np):
    hsdp = {"HSDP on a 2-D mesh matches one process"} if np == 4 else set()
    # torch 2.8: the gloo control is skipped (its own FSDP2 is off single-process training)
    old_gloo = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 9)
    assert passed_counts(run_mpi("fsdp.py", np), np, FSDP | hsdp) >= (7 if old_gloo else 8)


@pytest.mark.parametrize("np", [2, 3, 4])
def test_desync_detected_with_debug(np):
    # every collective compared before it runs
    assert passed_counts(run_mpi("desync.py", np, env={"TORCH_MPIGPU_DESYNC_CHECK": "1"}), np) >= 15


@pytest.mark.parametrize("np", [2, 3, 4])
def test_desync_detected_by_default(np):
    # no setting: the young group's collectives compared one by one, then a late mismatch found
    # by the digest within one interval (a short one here, and the default's at 2 ranks)
    env = {} if np == 2 else {"TORCH_MPIGPU_DESYNC_CHECK_FIRST_OPS": "40",
                              "TORCH_MPIGPU_DESYNC_CHECK_INTERVAL": "16"}
    assert passed_counts(run_mpi("desync.py", np, env=env), np) >= 17


# The node algorithm forced where nodes hold different counts (pretended on this host): every op
# in lanes, in 4 KiB pieces, with the random cases' sizes, dtypes and async interleavings
@pytest.mark.parametrize("np, pretend_nodes", [(5, 2), (7, 3)], ids=["3+2", "3+2+2"])
def test_random_ops_with_node_algorithm_on_nodes_holding_different_counts(np, pretend_nodes):
    env = {"MPIGPU_RANDOM_CASES": "500", **algo_env("node"), "TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096",
           "TORCH_MPIGPU_TEST_PRETEND_NODES": str(pretend_nodes)}
    assert passed_counts(run_mpi("random_ops.py", np, env=env, timeout=900), np) >= 500


# The leader form (NODE_LEADER=1: the node's first rank reduces one-node all_reduce and
# reduce_scatter for all, and takes all_gather's rows after its peers placed theirs) with the
# random cases' sizes, dtypes, views and async interleavings: on one node, and on nodes holding
# different counts (3 + 2 pretended: all_gather's rows shared in the leader form on each node)
@pytest.mark.parametrize("np, pretend_nodes", [(3, 1), (5, 2)], ids=["1x3", "3+2"])
def test_random_ops_with_node_algorithm_in_the_leader_form(np, pretend_nodes):
    env = {"MPIGPU_RANDOM_CASES": "500", **algo_env("node"), "TORCH_MPIGPU_NODE_BUFFER_BYTES": "4096",
           "TORCH_MPIGPU_NODE_LEADER": "1", "TORCH_MPIGPU_TEST_PRETEND_NODES": str(pretend_nodes)}
    assert passed_counts(run_mpi("random_ops.py", np, env=env, timeout=900), np) >= 500


@pytest.mark.parametrize("np", RANKS)
def test_random_ops_against_reference(np):
    # 1000 seeded random cases per world size; MPIGPU_RANDOM_CASES=20000 for a long run
    cases = int(os.environ.get("MPIGPU_RANDOM_CASES", "1000"))
    out = run_mpi("random_ops.py", np, env={"MPIGPU_RANDOM_CASES": str(cases)}, timeout=900)
    assert passed_counts(out, np) >= cases


@pytest.mark.parametrize("np", [2, 4])
def test_soak_threads_groups_memory_flat(np):
    out = run_mpi("soak.py", np, timeout=900)
    assert passed_counts(out, np) >= 5
    # no store request at the end met a closed store (departure notices sent at destroy did,
    # at 4 ranks, before the store's host held its store until every member had left)
    for sign in ("Broken pipe", "Connection was likely closed"):
        assert sign not in out, out[-3000:]
    print("\n".join(line for line in out.splitlines() if "RSS MiB" in line))


@pytest.mark.slow
def test_count_above_int_max():
    # 2^31 + 3 int8 elements per rank (2 GiB each, ~6 GiB in all): the node algorithm's pieces
    # and real large-count MPI calls (collectives forced to MPI's own, send/recv)
    assert passed_counts(run_mpi("large_count.py", 2, timeout=900), 2) >= 6


BACKEND_SURFACE = set(conftest.script_constant("backend_surface.py", "SECTIONS"))


@pytest.mark.parametrize("np", [2])
def test_backend_surface_answers_as_documented(np):
    # docs/operations.md's backend-surface table, one section per row
    assert passed_counts(run_mpi("backend_surface.py", np), np, BACKEND_SURFACE) >= 18


@pytest.mark.parametrize("library", ["accelerate", "lightning"])
def test_ecosystem_library_trains_like_one_process(library):
    require_library(library)
    out = run_mpi("ecosystem.py", 2, args=(library,), timeout=600)
    assert passed_counts(out, 2) >= 4

