"""Process groups over an MPI communicator the program already has: an ensemble member made by
splitting MPI_COMM_WORLD, the PyTorch part of a coupled simulation.

    comm = MPI.COMM_WORLD.Split(color=rank % 2, key=rank)      # mpi4py
    torch_mpi_gpu.init_process_group(comm=comm)                 # this rank's own default group

The communicator's ranks are torch's ranks, the rendezvous meets over it (a store served by its
rank 0 over MPI; with TORCH_MPIGPU_MASTER_PORT set, a TCP store whose address is agreed inside
it), and mpigpu's traffic runs on duplicates of it, never on it. Several disjoint
communicators in one job each get an independent default group."""

import torch
import torch.distributed as dist

from . import _C, config
from .launcher import reserve_port, select_cuda_device, store_address

# The communicator (Fortran handle) the default group being made is over; None: MPI_COMM_WORLD.
# Read by the backend's creator (torch_mpi_gpu._create_backend), which makes it the job's.
_default_group_comm = None


def fortran_handle(comm, op):
    """An mpi4py communicator's Fortran handle (py2f(): portable between MPI libraries); an int
    is taken as one (what MPI_Comm_c2f gives a C or C++ program)."""
    if isinstance(comm, int) and not isinstance(comm, bool):
        return comm
    py2f = getattr(comm, "py2f", None)
    if py2f is None:
        raise TypeError(f"mpigpu {op}: comm must be an mpi4py communicator or its Fortran handle "
                        f"(MPI_Comm_c2f), got {type(comm).__name__}")
    return py2f()


def default_group_comm():
    return _default_group_comm


def init_process_group(comm=None, backend="mpigpu", **kwargs):
    """`dist.init_process_group` whose ranks are those of `comm` (an mpi4py intracommunicator or
    its Fortran handle); collective over `comm`. Without `comm`, exactly dist.init_process_group.

    Rank, world size and the rendezvous come from `comm`, so `rank`, `world_size`,
    `init_method` and `store` may not be given; the rest (timeout, device_id, pg_options, ...)
    go to torch. Call it on every member of `comm` and only there."""
    if comm is None:
        return dist.init_process_group(backend, **kwargs)
    op = "init_process_group"
    given = [k for k in ("rank", "world_size", "init_method", "store")
             if kwargs.get(k) not in (None, -1)]  # (-1: torch's own "not given")
    if given:
        raise ValueError(f"mpigpu {op}(comm=...): {', '.join(given)} come from the communicator; "
                         "leave them out")
    if backend != "mpigpu":
        raise ValueError(f"mpigpu {op}(comm=...): backend {backend!r}: only mpigpu runs over an "
                         "MPI communicator")
    handle = fortran_handle(comm, op)
    _C.comm_rank_size(handle, op)  # MPI_COMM_NULL, an intercommunicator: a clear error
    if dist.is_initialized():
        raise RuntimeError(f"mpigpu {op}(comm=...): this process already has a default process "
                           "group; call dist.destroy_process_group() first")
    select_cuda_device()
    # (below MPI_THREAD_MULTIPLE the MPI store cannot serve: rendezvous.wanted() says why)
    if (config.get("TORCH_MPIGPU_MASTER_PORT")
            or _C.mpi_info()["thread_level"] != "MPI_THREAD_MULTIPLE"):
        # a free port on each communicator's rank 0: ensembles sharing a host each get a store
        host, port, rank, size, _, _ = store_address(reserve_port(), handle)
        url_host = f"[{host}]" if ":" in host else host
        meet = {"init_method": f"tcp://{url_host}:{port}", "rank": rank, "world_size": size}
    else:  # a store served over the communicator itself (rendezvous.py)
        meet = {"init_method": f"mpi://?comm={handle}"}
    global _default_group_comm
    _default_group_comm = handle
    try:
        dist.init_process_group(backend, **meet, **kwargs)
    finally:
        _default_group_comm = None


def new_group(comm, **kwargs):
    """`dist.new_group` of the processes of `comm` (an mpi4py intracommunicator or its Fortran
    handle, made from the default group's communicator, e.g. by splitting it); collective over
    `comm` only. Group ranks follow the default group's order (torch sorts a group's ranks).
    Other arguments (timeout, pg_options, group_desc, ...) go to torch."""
    op = "new_group"
    handle = fortran_handle(comm, op)
    _C.comm_rank_size(handle, op)
    if not dist.is_initialized():
        raise RuntimeError(f"mpigpu {op}(comm=...): no default process group yet; call "
                           "init_process_group first")
    ranks = _C.job_ranks_of(handle)
    return dist.new_group(ranks=ranks, use_local_synchronization=True, **kwargs)


def failed_ranks(group=None):
    """The ranks of `group` (default: the default group), in that group's numbering, that this
    process knows to have failed: what `shrink_group(ranks_to_exclude=...)` needs after a process
    failure under a fault-tolerant MPI (ULFM). Empty without ULFM, and before any failure."""
    pg = group if group is not None else dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    if not hasattr(backend, "failed_ranks"):
        raise TypeError(f"torch_mpi_gpu.failed_ranks: {type(backend).__name__} is not an mpigpu group")
    return list(backend.failed_ranks())


def keep_shrunk_groups_mpigpu():
    """torch's shrink_group registers the shrunk group's backend as NCCL's (a CUDA-bound group) or
    gloo's type, for one device only (torch 2.11-2.15, `_create_shrunk_process_group`). An mpigpu
    group then lost its other devices, and DDP's logger, reading the type as gloo's, read a
    ProcessGroupGloo that is not there (a segfault in c10d::Logger::set_env_variables, torch
    2.13). Register an mpigpu backend as the custom type it is, for every device mpigpu serves,
    as init_process_group and new_group do."""
    c10d = dist.distributed_c10d
    create = getattr(c10d, "_create_shrunk_process_group", None)
    if create is None or getattr(create, "_mpigpu", False):
        return

    def create_shrunk(new_backend, *args, **kwargs):
        pg = create(new_backend, *args, **kwargs)
        if isinstance(new_backend, _C.ProcessGroupMPIGPU):
            custom = dist.ProcessGroup.BackendType.CUSTOM
            for device in dist.Backend.backend_capability.get("mpigpu", ["cpu"]):
                pg._register_backend(torch.device(device), custom, new_backend)
            pg._set_default_backend(custom)
        return pg

    create_shrunk._mpigpu = True
    c10d._create_shrunk_process_group = create_shrunk
