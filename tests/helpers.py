"""What the single-process test files share: the repository's root, an environment without a
launcher's variables, and python(), which runs code in a fresh interpreter (each one its own
singleton MPI process, as a user's `python train.py` is)."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

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


def free_port():
    """A TCP port free now: for tests of torch's TCPStore, chosen by TORCH_MPIGPU_MASTER_PORT
    (the default rendezvous under an MPI launcher is the MPI store, with no port)."""
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
