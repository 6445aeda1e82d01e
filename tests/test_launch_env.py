"""Starting up: the backend's registration, the launcher detected from its variables, the
rendezvous (MASTER_ADDR agreed by probing, the store's port reserved), the local rank, a world of
one from plain python, MPI started by someone else, and the messages a wrong launch gets (srun
without --mpi, torchrun)."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from helpers import python


def test_registered_for_cpu_and_cuda():
    import torch.distributed as dist
    import torch_mpi_gpu

    assert "MPIGPU" in dist.Backend._plugins
    assert dist.Backend._plugins["MPIGPU"].extended_api
    assert set(dist.Backend.backend_capability["mpigpu"]) == {"cpu", "cuda"}
    assert torch_mpi_gpu.BACKEND_NAME == "mpigpu"


@pytest.mark.parametrize("env,launcher,rank,size,local", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     "Open MPI mpirun", 3, 8, 1),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"}, "MPICH/Hydra mpiexec", 2, 4, 0),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1"}, "Slurm srun", 5, 6, 1),
    ({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2"}, "MVAPICH", 1, 2, None),
    ({"PMIX_RANK": "7"}, "PMIx (prterun)", 7, None, None),
    # srun --mpi=pmix / --mpi=pmi2: the MPI's variables carry no local rank, Slurm's do
    ({"PMIX_RANK": "3", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
      "SLURM_STEP_ID": "0"}, "Slurm srun --mpi=pmix", 3, 4, 1),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
      "SLURM_STEP_ID": "0"}, "Slurm srun --mpi=pmi2", 2, 4, 0),
    # mpirun inside an sbatch script: every rank inherits the batch step's SLURM_PROCID=0 and
    # SLURM_LOCALID=0, which must not become rank 2's local rank
    ({"PMIX_RANK": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},
     "PMIx (prterun)", 2, 1, None),
])
def test_detect_launcher(env, launcher, rank, size, local):
    from torch_mpi_gpu.launcher import detect_launcher

    found = detect_launcher(env)
    assert found["launcher"] == launcher
    assert (found["rank"], found["size"], found["local_rank"]) == (rank, size, local)


def _fake_allgather(other_ranks_probes):
    """allgather for agree_master_addr on rank 0, other ranks answering with canned probes."""
    calls = []

    def allgather(mine):
        calls.append(mine)
        if len(calls) == 1:
            return [mine] + [b""] * len(other_ranks_probes)
        return [mine] + [json.dumps(p).encode() for p in other_ranks_probes]
    return allgather


def test_master_addr_is_the_first_address_every_rank_reaches(monkeypatch):
    from torch_mpi_gpu import launcher

    # a host name rank 2 cannot resolve (IP-only cluster), then an address everyone reaches
    monkeypatch.setattr(launcher, "host_addresses", lambda: ["node-a", "127.0.0.1"])
    monkeypatch.setattr(launcher, "_probe", lambda address, port: "ok")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    got = launcher.agree_master_addr(0, _fake_allgather([["ok", "ok"], ["unresolvable", "ok"]]))
    assert got == "127.0.0.1"


def test_no_reachable_master_addr_says_what_was_tried(monkeypatch):
    from torch_mpi_gpu import launcher

    monkeypatch.setattr(launcher, "host_addresses", lambda: ["node-a", "10.0.0.1"])
    monkeypatch.setattr(launcher, "_probe",
                        lambda address, port: "unresolvable" if address == "node-a" else "ok")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(RuntimeError) as e:
        launcher.agree_master_addr(0, _fake_allgather([["unresolvable", "timeout"],
                                                       ["ok", "refused"]]))
    text = str(e.value)
    assert "rank 0" in text and "no address of rank 0's host reaches every rank" in text
    # node-a: rank 0 (this process) cannot resolve it either; 10.0.0.1 is not ours at all
    assert "node-a: unresolvable from rank(s) 0,1" in text, text
    assert "10.0.0.1: " in text and "timeout from rank(s) 1" in text and "refused from rank(s) 2" in text
    assert "Set MASTER_ADDR" in text


def test_user_master_addr_on_rank_0_is_taken_without_probing(monkeypatch):
    from torch_mpi_gpu import launcher

    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setattr(launcher, "host_addresses", lambda: pytest.fail("probed anyway"))
    assert launcher.agree_master_addr(0, lambda mine: [mine, b""]) == "10.1.2.3"


def test_host_addresses_lists_names_then_ips():
    from torch_mpi_gpu import launcher

    found = launcher.host_addresses()
    assert found[0] == socket.gethostname()
    assert all(not a.startswith("127.") for a in found[1:])


def test_probe_tells_reachable_from_refused_and_unresolvable():
    from torch_mpi_gpu import launcher

    listener = launcher._ProbeListener()
    try:
        assert launcher._probe("127.0.0.1", listener.port) == "ok"
    finally:
        listener.close()
    assert launcher._probe("127.0.0.1", listener.port) == "refused"
    assert launcher._probe("no-such-host.invalid", 1) == "unresolvable"


def test_srun_without_mpi_plugin_stops_with_the_command_to_use():
    # srun without --mpi starts N singletons of world size 1: each would train alone, silently.
    rc, out = python("import torch.distributed as dist, torch_mpi_gpu\n"
                     "dist.init_process_group('mpigpu')",
                     env={"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"})
    assert rc != 0, out
    assert "started 2 tasks but MPI sees a world of 1" in out and "srun --mpi=pmix" in out, out


def test_local_rank_from_host_names_when_the_launcher_gives_none():
    # PMIx alone carries no local rank: it is then derived from the gathered host names.
    rc, out = python("import os, torch.distributed as dist, torch_mpi_gpu\n"
                     "dist.init_process_group('mpigpu')\n"
                     "print('local', os.environ['LOCAL_RANK'], os.environ['LOCAL_WORLD_SIZE'])\n"
                     "dist.destroy_process_group()", env={"PMIX_RANK": "0"})
    assert rc == 0 and "local 0 1" in out, out


RESERVED_PORT_SCRIPT = """
import datetime, socket, subprocess
import torch.distributed as dist
from torch_mpi_gpu import launcher
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
    f.write("40000 40001")  # two ephemeral ports: the reserved one and one more
port = launcher.reserve_port()
server = socket.create_server(("127.0.0.1", 50000))
taken = []
for _ in range(3):  # outgoing connections, as MPI and the address probes make before the store
    c = socket.socket()
    try:
        c.connect(("127.0.0.1", 50000))
        taken.append(c.getsockname()[1])
    except OSError:
        taken.append(None)
store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=10))
store.set("k", "v")
launcher.release_ports()
print("RESULT", port, taken, store.get("k").decode())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare for a private network namespace")
def test_reserved_store_port_is_never_an_outgoing_connections_port():
    # The rendezvous port rank 0 picks stays bound until the store listens: in a namespace of two
    # ephemeral ports, outgoing connections get only the other one, and the store still binds.
    out = subprocess.run(["unshare", "-n", sys.executable, "-c", RESERVED_PORT_SCRIPT],
                         capture_output=True, text=True, timeout=120, cwd="/")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    assert line, out.stdout + out.stderr
    _, port, *rest = line[0].split(" ", 2)
    other = 40001 if int(port) == 40000 else 40000
    assert int(port) in (40000, 40001) and rest[0] == f"[{other}, None, None] v", line[0]


def test_no_launcher_means_no_env_changes():
    from torch_mpi_gpu.launcher import detect_launcher

    assert detect_launcher({"RANK": "0", "WORLD_SIZE": "2"}) is None  # torchrun
    rc, out = python("import os, torch_mpi_gpu; print(torch_mpi_gpu.setup_env(), os.environ.get('RANK'))")
    assert rc == 0 and out.strip().endswith("None None"), out


def test_single_rank_group_works_without_launcher():
    rc, out = python(
        "import torch, torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
        "t = torch.arange(5.); dist.all_reduce(t); print('sum', t.tolist())\n"
        "dist.destroy_process_group()")
    assert rc == 0 and "sum [0.0, 1.0, 2.0, 3.0, 4.0]" in out, out


def test_plain_python_is_a_world_of_one():
    # no launcher, no RANK/WORLD_SIZE: an MPI singleton, rank and size from MPI itself
    rc, out = python(
        "import os, torch, torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu')\n"
        "t = torch.arange(5.); dist.all_reduce(t)\n"
        "print('world', dist.get_rank(), dist.get_world_size(), os.environ['RANK'],"
        " os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'], t.tolist())\n"
        "dist.destroy_process_group()")
    assert rc == 0 and "world 0 1 0 1 0 [0.0, 1.0, 2.0, 3.0, 4.0]" in out, out
    # rank= and world_size= given: left to torch (which wants MASTER_ADDR for them), no MPI world
    rc, out = python(
        "import torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu', rank=0, world_size=1)")
    assert rc != 0 and "MASTER_ADDR" in out, out


def test_torchrun_style_launch_names_the_mpirun_command():
    rc, out = python(
        "import torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=3)")
    assert rc != 0
    assert "mpirun -np 3 python" in out and "rank 0" in out, out


def test_mpi_initialised_by_someone_else_is_left_to_them():
    # mpi4py initialises MPI first (MPI_THREAD_MULTIPLE); mpigpu uses it and does not finalise it.
    rc, out = python(
        "from mpi4py import MPI\n"
        "import atexit  # registered first, so it runs after torch_mpi_gpu's own exit hook\n"
        "atexit.register(lambda: print('finalized after our exit hook:', MPI.Is_finalized()))\n"
        "import torch, torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
        "t = torch.ones(2); dist.all_reduce(t)\n"
        "print('ours', torch_mpi_gpu._C.mpi_info()['initialized_by_us'], t.tolist())\n"
        "dist.destroy_process_group()\n")
    assert rc == 0, out
    assert "ours False [1.0, 1.0]" in out and "finalized after our exit hook: False" in out, out
