"""Run as pid 1 of a PID namespace of its own (unshare --pid --fork --mount-proc), where no other
process takes pids: Open MPI 5's mpirun started at the pid of an mpirun that was SIGKILLed, whose
session folder TMPDIR/ompi.<pid> is still there; then the same after conftest's cleanup, and
torch_mpi_gpu's launcher (python -m torch_mpi_gpu.mpirun) at such a pid. Prints
each killed mpirun ("left by the killed mpirun (pid P): True") and each try ("at pid P: exit E:
<the first line of its message>"). argv: the mpirun to run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import open_mpi_session_folders_of_ended_launchers  # noqa: E402

MPIRUN = sys.argv[1]
FOLDER = Path(os.environ["TMPDIR"])


def start(*command):
    return subprocess.Popen([MPIRUN, "--oversubscribe", "-np", "1", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_every_other_process():
    """The killed mpirun's rank lives on (a SIGKILL reaches mpirun alone); as pid 1 we reap it."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
    time.sleep(0.5)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


def run_at_pid(pid, launch=lambda: start("true")):
    # the kernel gives the next process the pid after ns_last_pid (nobody else forks in here)
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
    job = launch()
    out = job.communicate(timeout=60)[0].strip()
    first = out.splitlines()[1] if out.startswith("-----") else (out.splitlines() or [""])[0]
    print(f"at pid {job.pid}: exit {job.returncode}: {first}", flush=True)


def leave_a_killed_mpirun():
    """Its pid, its session folder left behind."""
    killed = start("sleep", "60")
    session = FOLDER / f"ompi.{killed.pid}"
    deadline = time.monotonic() + 30
    while not session.is_dir() and time.monotonic() < deadline:
        time.sleep(0.1)
    killed.kill()
    killed.wait()
    kill_every_other_process()
    print(f"left by the killed mpirun (pid {killed.pid}): {session.is_dir()}", flush=True)
    return killed.pid


# (the mpirun that fails at a stale folder removes it as it exits: a fresh one for each try)
run_at_pid(leave_a_killed_mpirun())
pid = leave_a_killed_mpirun()
for folder in open_mpi_session_folders_of_ended_launchers(FOLDER):
    subprocess.run(["rm", "-rf", str(folder)], check=True)
run_at_pid(pid)
# torch_mpi_gpu's own launcher (python -m torch_mpi_gpu.mpirun) removes the folder of its pid
run_at_pid(leave_a_killed_mpirun(), lambda: subprocess.Popen(
    [sys.executable, "-m", "torch_mpi_gpu.mpirun", "-np", "1", "true"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
