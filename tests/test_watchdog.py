"""The watchdog and the end of a job, in one process: the watchdog's tick, a world of one that
outlives the shell that started it, collectives that never wait for a hanging store, and an abort
that waits until its output is read."""

import re
import subprocess
import sys
import time
from pathlib import Path


from helpers import ENV, ROOT, python


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
