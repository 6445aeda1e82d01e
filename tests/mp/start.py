"""Where a tests/mp rank starts: `python start.py SCRIPT ARGS...` imports torch with Python's
cyclic collector off, moves what the import made out of the collector's reach (gc.freeze, as
Python's docs suggest before forking workers), turns it back on, then runs SCRIPT as __main__
with ARGS as its argv. Each rank of every launch pays for importing torch, and most of what it
pays is the collector: passes over torch's few hundred thousand objects while they are made,
and a last one over all of them at exit. Measured on the 2-core VM (2026-12-02, 8 runs each, a
process importing torch, torch.distributed and torch_mpi_gpu): 1.97 s of CPU plain, 1.25 s
this way.

What the script makes (groups, works, tensors) is collected as in any program, at exit too.
The exit tests' scripts (exits.py, shutdown.py) do not start here: they start and end exactly as
users' programs do (tests/conftest.py, rank_command)."""

import gc
import os
import runpy
import sys
import time

# (when the rank started and when torch was in: common.Checker reports them per launch)
os.environ["MPIGPU_TEST_T0"] = repr(time.monotonic())
gc.disable()
import torch  # noqa: E402,F401
import torch.distributed  # noqa: E402,F401

os.environ["MPIGPU_TEST_T_TORCH"] = repr(time.monotonic())

gc.freeze()
gc.enable()

script = os.path.join(os.path.dirname(os.path.abspath(__file__)), sys.argv[1])
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
