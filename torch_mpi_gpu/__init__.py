"""torch_mpi_gpu: the `mpigpu` torch.distributed backend over MPI.

    import torch_mpi_gpu                       # registers "mpigpu"
    dist.init_process_group("mpigpu")          # under mpirun / mpiexec / srun
"""

import atexit
import json
from pathlib import Path

import torch
import torch.distributed as dist

from . import _C
from .launcher import (choose_mpi_yield, detect_launcher, install_env_rendezvous_hook,
                       select_cuda_device, setup_env)

__version__ = "0.1.0"
BACKEND_NAME = "mpigpu"
__all__ = ["BACKEND_NAME", "build_info", "detect_launcher", "info", "setup_env", "ProcessGroupMPIGPU"]

ProcessGroupMPIGPU = _C.ProcessGroupMPIGPU


def _create_backend(dist_backend_opts, pg_options):
    """c10d creator (extended API): runs on member ranks only, once per group."""
    timeout = dist_backend_opts.timeout
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    select_cuda_device()  # before MPI_Init, if this is where MPI starts
    return _C.ProcessGroupMPIGPU(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        list(dist_backend_opts.global_ranks_in_group),
        seconds,
        str(dist_backend_opts.group_id),
    )


def _devices():
    """Device types mpigpu serves: cpu, cuda, and xpu in torch builds that have it (XPU tensors
    take the via-cpu path)."""
    devices = ["cpu", "cuda"]
    xpu = getattr(torch, "xpu", None)
    try:
        if xpu is not None and xpu._is_compiled():
            devices.append("xpu")
    except (AttributeError, RuntimeError):
        pass
    return devices


def _register():
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True,
                                  devices=_devices())


def build_info():
    """How this copy was built: which MPI (and where from), CUDA sources or not, torch version."""
    path = Path(__file__).with_name("_build_info.json")
    return json.loads(path.read_text()) if path.exists() else {}


def info():
    """A dict describing the MPI library, thread level, CUDA-awareness, data paths and settings.

    Initialises MPI if nothing has yet.
    """
    from .info import collect
    return collect()


_register()
install_env_rendezvous_hook()
choose_mpi_yield()  # (opt-in) MPI reads it at MPI_Init, which has not happened yet
# Engines stop and MPI is finalised (only if we initialised it) before the interpreter tears down.
atexit.register(_C.shutdown)
