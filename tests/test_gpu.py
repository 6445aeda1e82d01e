"""GPU tests: every op on CUDA tensors through the cuda-direct path (when the MPI is CUDA-aware)
and the cuda-staged path (forced, with a small pipeline piece so large messages really pipeline),
stream ordering, mixed CUDA/CPU ranks, and DDP with CUDA tensors. Several ranks share one GPU.
Marked `gpu` and skipped (not failed) where no CUDA device is visible."""

import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import run_mpi
from test_multirank import passed_counts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")]

STAGED = {"TORCH_MPIGPU_CUDA_AWARE": "0", "TORCH_MPIGPU_STAGING_CHUNK_BYTES": "4096",
          "MPIGPU_EXPECT_PATH": "cuda-staged"}
DIRECT = {"TORCH_MPIGPU_CUDA_AWARE": "1", "TORCH_MPIGPU_CUDA_REDUCE": "direct",
          "MPIGPU_EXPECT_PATH": "cuda-direct", "MPIGPU_EXPECT_REDUCE_PATH": "cuda-direct"}
# The default on a CUDA-aware MPI: device pointers, except reductions on Open MPI (staged).
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
            pytest.skip(f"this MPI is not CUDA-aware ({auto_cuda_path()}); build against a "
                        "CUDA-aware one (scripts/build_openmpi_cuda.sh) to test cuda-direct")
        return DIRECT if path == "direct" else HYBRID
    return STAGED


@pytest.mark.parametrize("path", ["direct", "staged", "hybrid"])
@pytest.mark.parametrize("np", [2, 3])
def test_collectives_cuda(path, np):
    out = run_mpi("collectives.py", np, env={"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)})
    assert passed_counts(out, np) > 1500


@pytest.mark.parametrize("path", ["direct", "staged"])
@pytest.mark.parametrize("np", [2, 3])
def test_p2p_groups_cuda(path, np):
    out = run_mpi("p2p_groups.py", np, env={"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)})
    assert passed_counts(out, np) > 30


@pytest.mark.parametrize("path", ["direct", "staged"])
@pytest.mark.parametrize("np", [2, 3])
def test_stream_ordering(path, np):
    out = run_mpi("cuda_streams.py", np, env={"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)})
    assert passed_counts(out, np) >= 7


@pytest.mark.parametrize("np", [2, 3])
def test_mixed_cuda_and_cpu_ranks(np):
    # rank 0's tensors on CUDA, the others' on CPU, in the same collectives
    out = run_mpi("collectives.py", np, env={"MPIGPU_TEST_DEVICE": "mixed"})
    assert passed_counts(out, np) > 1500


@pytest.mark.parametrize("path", ["direct", "staged", "hybrid"])
def test_ddp_cuda(path):
    out = run_mpi("ddp.py", 2, env={"MPIGPU_TEST_DEVICE": "cuda", **path_env(path)})
    assert passed_counts(out, 2) >= 60
