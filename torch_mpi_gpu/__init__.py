"""torch_mpi_gpu: the `mpigpu` torch.distributed backend over MPI.

    import torch_mpi_gpu                       # registers "mpigpu"
    dist.init_process_group("mpigpu")          # under mpirun / mpiexec / srun
    torch_mpi_gpu.init_process_group(comm=c)   # or over a communicator of your own (mpi4py)
"""

import atexit
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from ._checkout import _C
from . import config, flight_recorder, groups, rendezvous  # noqa: F401  (flight_recorder.dump())
from .groups import failed_ranks, init_process_group, new_group
from .launcher import (choose_mpi_yield, detect_launcher, install_env_rendezvous_hook,
                       release_ports, select_cuda_device, setup_env)

__version__ = "0.1.0"
BACKEND_NAME = "mpigpu"
__all__ = ["BACKEND_NAME", "build_info", "detect_launcher", "failed_ranks", "info", "init_process_group",
           "new_group", "serve_device", "setup_env", "ProcessGroupMPIGPU"]

ProcessGroupMPIGPU = _C.ProcessGroupMPIGPU


def _create_backend(dist_backend_opts, pg_options):
    """c10d creator (extended API): runs on member ranks only, once per group."""
    timeout = dist_backend_opts.timeout
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    release_ports()  # the group's store listens by now
    select_cuda_device()  # before MPI_Init, if this is where MPI starts
    if not dist.is_initialized():  # the default group: its ranks are those of its communicator
        _C.use_job_comm(groups.default_group_comm())
    return _C.ProcessGroupMPIGPU(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        list(dist_backend_opts.global_ranks_in_group),
        seconds,
        str(dist_backend_opts.group_id),
    )


def _devices():
    """Device types mpigpu serves: cpu, cuda, a PrivateUse1 device named before this import, and
    xpu in torch builds that have it (those take the via-cpu path); serve_device() adds more."""
    devices = ["cpu", "cuda"]
    privateuse1 = torch._C._get_privateuse1_backend_name()
    if privateuse1 != "privateuseone":  # a PrivateUse1 device already named (imported first)
        devices.append(privateuse1)
    xpu = getattr(torch, "xpu", None)
    try:
        if xpu is not None and xpu._is_compiled():
            devices.append("xpu")
    except (AttributeError, RuntimeError):
        pass
    return devices


def serve_device(device_type):
    """Have mpigpu carry tensors of `device_type` too: a torch device type name such as "xpu", or
    the name of a PrivateUse1 backend (torch.utils.rename_privateuse1_backend). Its tensors take
    the via-cpu path (copied to host memory on the calling thread, and back before the Work
    completes). Call it before init_process_group / new_group: torch fixes a group's devices when
    it creates the group."""
    devices = dist.Backend.backend_capability[BACKEND_NAME]
    if device_type not in devices:
        devices.append(device_type)


def _register():
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True,
                                  devices=_devices())


def build_info():
    """How this copy was built: which MPI (and where from), CUDA sources or not, torch version."""
    path = Path(__file__).with_name("_build_info.json")
    return json.loads(path.read_text()) if path.exists() else {}


def info(all_tiers=False):
    """A dict describing the MPI library, thread level, CUDA-awareness, launcher, data paths and
    the user settings (`all_tiers`: the tuning, build and test settings too).

    Initialises MPI if nothing has yet.
    """
    from .info import collect
    return collect(all_tiers)


def _install_abort_on_uncaught_exception():
    """A rank that leaves on an uncaught exception must end the whole job: otherwise its exit
    handlers finalise MPI, which waits for the ranks still inside a collective with it, forever.
    Print the traceback, then MPI_Abort (as mpi4py's `python -m mpi4py` does). Normal exits and
    sys.exit() still finalise cleanly."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        size = _C.running_world_size()
        if size <= 1 or config.get("TORCH_MPIGPU_ABORT_ON_EXCEPTION") == "0":
            previous(exc_type, exc, tb)
            return
        # Straight to the process's stderr: torch's own excepthook (installed by
        # init_process_group, wrapping this one) buffers sys.stderr until we return, and we
        # do not return.
        # before any group exists RANK may be unset: MPI's own rank is always known here
        rank = os.environ.get("RANK") or str(_C.mpi_info()["world_rank"])
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        err = sys.__stderr__
        err.write("".join(f"[rank{rank}]: {line}\n" for line in text.rstrip("\n").split("\n")))
        err.write(f"mpigpu [rank {rank}]: uncaught {exc_type.__name__}; ending all {size} ranks "
                  "with MPI_Abort so none waits for this one forever "
                  "(TORCH_MPIGPU_ABORT_ON_EXCEPTION=0 turns this off)\n")
        err.flush()
        sys.stdout.flush()
        # the launcher forwards output asynchronously and drops what is in flight when the job
        # is aborted: give it a moment to pass the traceback on
        time.sleep(1.0)
        _C.abort_job(1)

    hook._mpigpu = True
    if not getattr(sys.excepthook, "_mpigpu", False):
        sys.excepthook = hook


_register()
groups.keep_shrunk_groups_mpigpu()
rendezvous.register()  # init_method="mpi://"
install_env_rendezvous_hook()
_install_abort_on_uncaught_exception()
choose_mpi_yield()  # MPI reads it at MPI_Init, which has not happened yet
# Engines stop and MPI is finalised (only if we initialised it) before the interpreter tears down.
atexit.register(_C.shutdown)
