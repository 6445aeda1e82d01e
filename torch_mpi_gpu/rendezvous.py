"""The `mpi://` rendezvous: the group meets through a store served over MPI (csrc/store/), so no
process listens on a TCP port and nobody picks an address or a port.

    dist.init_process_group("mpigpu")                      # under mpirun/mpiexec/srun/prterun
    dist.init_process_group("mpigpu", init_method="mpi://")
    torch_mpi_gpu.init_process_group(comm=c)               # mpi://?comm=<Fortran handle>

Under an MPI launcher the default `env://` takes this path when neither MASTER_ADDR nor
MASTER_PORT is set (a MASTER_* variable, TORCH_MPIGPU_MASTER_PORT, tcp:// or store= keep torch's
TCP store). Rank and world size are the communicator's: a rank or world size given
otherwise must equal them."""

import os
import socket
from datetime import timedelta
from urllib.parse import parse_qsl, urlparse

from . import _C, config
from .launcher import check_world_size, detect_launcher, forget_our_env, remember_our_env, \
    select_cuda_device

SCHEME = "mpi"
DEFAULT_TIMEOUT = timedelta(minutes=30)


def wanted(environ=None):
    """Whether the default env:// rendezvous should meet over MPI here: a launcher we know
    started this process (or, with `unlaunched`, none did and nobody set RANK/WORLD_SIZE), and the
    user chose no TCP store (MASTER_ADDR, MASTER_PORT, TORCH_MPIGPU_MASTER_PORT), and MPI grants
    MPI_THREAD_SERIALIZED or more (below that, asking MPI here raises the error that says which
    level mpigpu needs). May start MPI: select the CUDA device first."""
    environ = os.environ if environ is None else environ
    if config.get("TORCH_MPIGPU_AUTO_ENV") == "0":
        return False
    if config.get("TORCH_MPIGPU_MASTER_PORT"):
        return False
    if "MASTER_ADDR" in environ or "MASTER_PORT" in environ:
        return False
    # (MPI starts here)
    return _C.mpi_info()["thread_level"] in ("MPI_THREAD_MULTIPLE", "MPI_THREAD_SERIALIZED")


def _fill_env(found, rank, size, comm):
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE for programs that read them, where unset
    (the launcher's local rank, else this rank's place among the ranks on its host)."""
    values = {"RANK": str(rank), "WORLD_SIZE": str(size)}
    local, local_size = (found or {}).get("local_rank"), (found or {}).get("local_size")
    if local is None or local_size is None:
        _, _, _, _, _, local, local_size = _C.bootstrap_address(socket.gethostname(), 0, comm)
    values["LOCAL_RANK"], values["LOCAL_WORLD_SIZE"] = str(local), str(local_size)
    remember_our_env({k: v for k, v in values.items() if k not in os.environ})
    for k, v in values.items():
        os.environ.setdefault(k, v)


def handler(url, timeout=DEFAULT_TIMEOUT, **kwargs):
    """torch's rendezvous handler for mpi:// (register_rendezvous_handler): yields (store, rank,
    world size) once; collective over the communicator (`?comm=<Fortran handle>`, else
    MPI_COMM_WORLD)."""
    query = dict(parse_qsl(urlparse(url).query))
    comm = int(query["comm"]) if "comm" in query else None
    forget_our_env()
    select_cuda_device()  # before MPI_Init, if this is where MPI starts
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    store, rank, size = _C.mpi_store(comm, seconds)
    for key, got in (("rank", rank), ("world_size", size)):
        given = int(query.get(key, "-1"))
        if given not in (-1, got):
            raise ValueError(
                f"mpigpu init_process_group [rank {rank}]: {key}={given} was given, but the MPI "
                f"communicator the mpi:// rendezvous meets on says {got}. Leave {key} out (MPI "
                "decides it), or meet elsewhere (init_method='tcp://...', or MASTER_ADDR and "
                "MASTER_PORT set).")
    if comm is None:
        found = detect_launcher()
        check_world_size(found, size)
        if config.get("TORCH_MPIGPU_AUTO_ENV") != "0":
            _fill_env(found, rank, size, comm)
    yield store, rank, size
    raise RuntimeError("mpigpu: the mpi:// rendezvous cannot be repeated: call "
                       "init_process_group again (after destroy_process_group)")


def register():
    """Registers mpi:// with torch (once per process)."""
    import importlib

    # (torch.distributed.rendezvous is also a function's name there)
    rdzv = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(rdzv, "_rendezvous_handlers", {})
    if SCHEME not in handlers:
        rdzv.register_rendezvous_handler(SCHEME, handler)
