"""Launcher detection and the TCP rendezvous: make `dist.init_process_group("mpigpu")` work under
an MPI launcher with no environment variables set by the user.

By default the group meets over MPI (rendezvous.py: a store served over MPI, no TCP port); this
module detects the launcher, fills RANK/WORLD_SIZE/LOCAL_RANK from MPI, and keeps torch's env://
TCP store for the paths that still ask for one (MASTER_ADDR or MASTER_PORT set,
TORCH_MPIGPU_MASTER_PORT). There rank and size come from MPI itself
and the store address is agreed through MPI (rank 0 picks a free port, held until the store
listens, and broadcasts it; 127.0.0.1 when every rank is on one host). Across hosts, rank 0
publishes the names and addresses of its host and every rank tries to resolve and connect to
each; the first one every rank reached becomes MASTER_ADDR (clusters often have no DNS for node
names).
"""

import concurrent.futures
import fcntl
import json
import logging
import os
import socket
import struct
import threading

from . import config

log = logging.getLogger("torch_mpi_gpu")

# (launcher, rank variable, size variable, local-rank variable, local-size variable)
LAUNCHERS = [
    ("Open MPI mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MVAPICH", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
     "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH/Hydra mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PMIx (prterun)", "PMIX_RANK", None, None, None),
    ("Slurm srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
]

# Where a launcher's own variables carry no local rank or size (PMIx, Hydra under srun), these
# may: the first one present whose rank variable agrees with the rank found wins (under sbatch,
# every rank mpirun starts inherits the batch step's SLURM_PROCID=0 and SLURM_LOCALID=0).
LOCAL_FALLBACKS = [("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_PROCID"),
                   ("MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_RANK"),
                   ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                    "OMPI_COMM_WORLD_RANK"),
                   ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_RANK")]
SIZE_FALLBACKS = ["SLURM_NTASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"]
# srun's MPI plugins set the PMI variables of the MPI they serve
SRUN_PLUGINS = {"PMIx (prterun)": "pmix", "MPICH/Hydra mpiexec": "pmi2"}

TORCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# Variables this module set (not the user): refreshed at every rendezvous, so destroy +
# re-init gets a fresh store port instead of racing the old store's shutdown.
_set_by_us = {}


def detect_launcher(environ=None):
    """The launcher that started this process, as a dict, or None (e.g. torchrun, plain python)."""
    environ = os.environ if environ is None else environ

    def read(var):
        v = environ.get(var) if var else None
        return int(v) if v is not None and v.strip().isdigit() else None

    for name, rank, size, local_rank, local_size in LAUNCHERS:
        if rank in environ:
            found = {"launcher": name, "rank": read(rank), "size": read(size),
                     "local_rank": read(local_rank), "local_size": read(local_size)}
            if found["local_rank"] is None:
                for lr, ls, rank_var in LOCAL_FALLBACKS:
                    if read(lr) is not None and read(rank_var) == found["rank"]:
                        found["local_rank"], found["local_size"] = read(lr), read(ls)
                        break
            if found["size"] is None:
                found["size"] = next((read(v) for v in SIZE_FALLBACKS if read(v) is not None), None)
            if (name in SRUN_PLUGINS and "SLURM_STEP_ID" in environ
                    and read("SLURM_PROCID") == found["rank"]):
                found["launcher"] = f"Slurm srun --mpi={SRUN_PLUGINS[name]}"
            return found
    return None


def check_world_size(found, mpi_size):
    """The launcher started several tasks but MPI sees a world of 1: every task is its own MPI
    job (srun without its --mpi plugin), which would otherwise train N copies silently."""
    if found and (found.get("size") or 1) > 1 and mpi_size == 1:
        slurm = found["launcher"].startswith("Slurm srun")
        raise RuntimeError(
            f"mpigpu: {found['launcher']} started {found['size']} tasks but MPI sees a world of 1 "
            "in each: the tasks are separate MPI jobs. "
            + ("srun needs the plugin of your MPI: `srun --mpi=pmix ...` for Open MPI, "
               "`srun --mpi=pmi2 ...` for MPICH (`srun --mpi=list` shows what this Slurm has), "
               "or launch with mpirun inside the allocation." if slurm else
               "Launch with the mpirun/mpiexec of the MPI torch_mpi_gpu was built against."))


# Ports chosen for a rendezvous store, each held by a bound socket until the store listens on it:
# Linux never gives a port bound so to an outgoing connection, and one could otherwise take it
# between the choice and the store's bind (EADDRINUSE, seen in CI across two simulated hosts).
_reserved_ports = {}


def reserve_port():
    """A free port, held until release_ports(); the store binds beside the holder (SO_REUSEADDR,
    which torch's TCPStore sets too; the holder never listens)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", 0))
    port = s.getsockname()[1]
    _reserved_ports[port] = s
    return port


def release_ports(keep=None):
    """Close the holders of reserved ports (but `keep`'s): once the store listens, or on ranks
    whose choice was not taken."""
    for port in [p for p in _reserved_ports if p != keep]:
        _reserved_ports.pop(port).close()


PROBE_TIMEOUT_S = 3.0


def host_addresses():
    """This host's names and non-loopback IP addresses, most readable first: what rank 0 offers
    as MASTER_ADDR. IPv4 from the interfaces (SIOCGIFADDR), global IPv6 from /proc."""
    names = [socket.gethostname()]
    fqdn = socket.getfqdn()
    if fqdn not in names and fqdn != "localhost":
        names.append(fqdn)
    ips = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, ifname in socket.if_nameindex():
            try:
                req = struct.pack("256s", ifname.encode()[:15])
                ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address on this interface
            if not ip.startswith("127."):
                ips.append(ip)
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                hexaddr, _, _, scope, _, ifname = line.split()
                if scope == "00" and ifname != "lo":  # global scope only: link-local needs %if
                    ips.append(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hexaddr)))
    except OSError:
        pass
    return names + [ip for ip in dict.fromkeys(ips)]


def _probe(address, port, timeout=PROBE_TIMEOUT_S):
    """'ok', or why this rank cannot use address: 'unresolvable', 'refused', 'timeout', ..."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return "unresolvable"
    reason = "no address"
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(timeout)
                s.connect(sockaddr)
                return "ok"
        except socket.timeout:
            reason = "timeout"
        except ConnectionRefusedError:
            reason = "refused"
        except OSError as e:
            reason = e.strerror or type(e).__name__
    return reason


class _ProbeListener:
    """A listening socket on every address of rank 0's host, accepting and closing, so other
    ranks can check they reach a candidate address before the store is started there."""

    def __init__(self):
        self.sock = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True) \
            if socket.has_dualstack_ipv6() else socket.create_server(("", 0))
        self.port = self.sock.getsockname()[1]
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="mpigpu-probe", daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                conn.close()
            except (socket.timeout, OSError):
                pass

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def agree_master_addr(rank, allgather):
    """Collective: the address of rank 0's host that every rank can resolve and connect to.

    allgather(bytes) -> list of every rank's bytes (MPI_COMM_WORLD). Raises on every rank, with
    what each rank found for each address, when no address works for all."""
    user_choice = os.environ.get("MASTER_ADDR") if rank == 0 else None
    listener = _ProbeListener() if rank == 0 and not user_choice else None
    try:
        offer = ""
        if rank == 0:
            offer = json.dumps({"user": user_choice} if user_choice else
                               {"addresses": host_addresses(), "port": listener.port})
        offer = json.loads(allgather(offer.encode())[0])
        if "user" in offer:  # rank 0's MASTER_ADDR, set by the user: everyone takes it
            return offer["user"]
        addresses, port = offer["addresses"], offer["port"]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(addresses))) as pool:
            mine = list(pool.map(lambda a: _probe(a, port), addresses))
        every = [json.loads(b) for b in allgather(json.dumps(mine).encode())]
    finally:
        if listener:
            listener.close()
    for i, address in enumerate(addresses):
        if all(found[i] == "ok" for found in every):
            return address
    lines = []
    for i, address in enumerate(addresses):
        failed = {}
        for r, found in enumerate(every):
            if found[i] != "ok":
                failed.setdefault(found[i], []).append(r)
        lines.append(f"  {address}: " + "; ".join(f"{why} from rank(s) {_ranks(rs)}"
                                                  for why, rs in failed.items()))
    raise RuntimeError(
        f"mpigpu: rank {rank}: no address of rank 0's host reaches every rank, so the rendezvous "
        f"store cannot start. Tried (connect to a probe on port {port}, {PROBE_TIMEOUT_S:g} s "
        "each):\n" + "\n".join(lines) + "\nSet MASTER_ADDR (and MASTER_PORT) to an address of "
        "rank 0's host that every host can reach, or make the host names resolve everywhere.")


def _ranks(ranks, shown=8):
    text = ",".join(map(str, ranks[:shown]))
    return text + (f",... ({len(ranks)} ranks)" if len(ranks) > shown else "")


def oversubscribed(environ=None):
    """More ranks on this host than cores they may use, as this rank can see it before MPI
    starts: a rank bound to a part of the node (its affinity mask smaller than the node) was given
    those cores by the launcher; an unbound rank shares the node's cores with the launcher's
    local ranks. Then a thread spinning while it waits takes a core another rank needs."""
    environ = os.environ if environ is None else environ
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if cores < (os.cpu_count() or cores):
        return False  # bound by the launcher: these cores are this rank's
    found = detect_launcher(environ) or {}
    return (found.get("local_size") or 1) > cores


def choose_mpi_yield(environ=None):
    """Before MPI starts: ask Open MPI to yield the core while a rank waits inside MPI
    (mpi_yield_when_idle) when TORCH_MPIGPU_MPI_YIELD=1, or =auto (the default) and the host is
    oversubscribed; and tell the engines, so that a caller in wait() sleeps at once instead of
    testing for completion beside the worker. A user's own OMPI_MCA_mpi_yield_when_idle wins.
    Returns the Open MPI value set, or None (left alone)."""
    environ = os.environ if environ is None else environ
    want = config.get("TORCH_MPIGPU_MPI_YIELD")
    if want not in ("auto", "1", "0"):
        raise ValueError(f"TORCH_MPIGPU_MPI_YIELD={want} must be auto, 1 or 0")
    crowded = want == "1" or (want == "auto" and oversubscribed(environ))
    from . import _C

    _C.set_oversubscribed(crowded)
    if "OMPI_MCA_mpi_yield_when_idle" in environ or not crowded:
        return None
    environ["OMPI_MCA_mpi_yield_when_idle"] = "1"
    return "1"


def select_cuda_device(environ=None):
    """Make cuda:(local rank mod device count) current before MPI starts; returns it or None.

    CUDA-aware MPIs set up their CUDA IPC resources for the device current at MPI_Init. Skipped
    when CUDA is already initialised in this process (the user chose a device), when no launcher
    gives a local rank, or with TORCH_MPIGPU_SET_DEVICE=0.
    """
    if config.get("TORCH_MPIGPU_SET_DEVICE") == "0":
        return None
    import torch
    if not torch.cuda.is_available() or torch.cuda.is_initialized():
        return None
    found = detect_launcher(environ)
    local = found["local_rank"] if found else None
    if local is None:
        env_local = (environ or os.environ).get("LOCAL_RANK", "")
        local = int(env_local) if env_local.isdigit() else None
    if local is None:
        return None
    device = local % torch.cuda.device_count()
    torch.cuda.set_device(device)
    log.info("mpigpu: local rank %d uses cuda:%d", local, device)
    return device


def store_address(port, comm=None):
    """Collective over `comm` (a Fortran handle; None: MPI_COMM_WORLD): where the rendezvous
    store listens, rank 0's `port` on the address every rank reaches (loopback when all share a
    host). Returns (host, port, rank, size, index among the ranks on its host, their count)."""
    from . import _C

    host, port, single_host, rank, size, host_rank, host_size = _C.bootstrap_address(
        socket.gethostname(), port, comm)
    release_ports(keep=port if rank == 0 else None)  # rank 0's store will listen on it
    if not single_host:
        host = agree_master_addr(rank, lambda mine: _C.allgather_bytes(mine, comm))
    return ("127.0.0.1" if single_host else host), port, rank, size, host_rank, host_size


def forget_our_env():
    """Removes the variables an earlier rendezvous of ours set (not the user's), so that this one
    sees only the user's choices."""
    for key, value in _set_by_us.items():
        if os.environ.get(key) == value:
            del os.environ[key]
    _set_by_us.clear()


def remember_our_env(values):
    _set_by_us.update(values)


def launched(environ=None, unlaunched=False):
    """Whether MPI says this process's rank and size: a launcher we know started it, or
    (`unlaunched`) none did and nobody set RANK or WORLD_SIZE (an MPI singleton, or a launcher we
    do not know that starts an MPI world)."""
    environ = os.environ if environ is None else environ
    return detect_launcher(environ) is not None or (
        unlaunched and "RANK" not in environ and "WORLD_SIZE" not in environ)


def setup_env(force=False, unlaunched=False):
    """Fill torch's rendezvous variables from the MPI launcher; returns what was set (or None).

    `unlaunched`: also where no launcher we know started this process and nobody set RANK or
    WORLD_SIZE: MPI's own world then says them (plain `python train.py` is an MPI singleton, a
    world of 1, as the MPI standard has it; a launcher we do not know starts an MPI world too).

    Collective over MPI_COMM_WORLD when it has to agree on an address: call it on every rank.
    """
    if config.get("TORCH_MPIGPU_AUTO_ENV") == "0" and not force:
        return None
    found = detect_launcher()
    forget_our_env()
    if found is None and unlaunched and "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        found = {"launcher": "none known (MPI's own world)", "rank": None, "size": None,
                 "local_rank": None, "local_size": None}
    if found is None or (all(v in os.environ for v in TORCH_VARS) and not force):
        return None
    select_cuda_device()
    port = int(config.get("TORCH_MPIGPU_MASTER_PORT") or 0) or reserve_port()
    host, port, rank, size, host_rank, host_size = store_address(port)
    check_world_size(found, size)
    values = {"RANK": str(rank), "WORLD_SIZE": str(size), "MASTER_ADDR": host,
              "MASTER_PORT": str(port)}
    # the launcher's local rank, else the rank's place among the ranks on its host
    values["LOCAL_RANK"] = str(found["local_rank"] if found["local_rank"] is not None else host_rank)
    values["LOCAL_WORLD_SIZE"] = str(found["local_size"] if found["local_size"] is not None
                                     else host_size)
    set_now = {}
    for k, v in values.items():
        if k not in os.environ:
            os.environ[k] = v
            set_now[k] = v
    remember_our_env(set_now)
    log.info("mpigpu: launcher %s, set %s", found["launcher"], set_now)
    return set_now


def install_env_rendezvous_hook():
    """Run setup_env() just before torch's env:// rendezvous, so nothing happens at import time."""
    import importlib
    from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

    rdzv = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    if handlers is None or "env" not in handlers or getattr(handlers["env"], "_mpigpu", False):
        return False
    original = handlers["env"]

    def env_handler(url, **kwargs):
        from . import rendezvous

        parts = urlparse(url)
        query = dict(parse_qsl(parts.query))
        # neither rank= nor world_size= given: MPI may say them even without a launcher
        unranked = query.get("rank", "-1") == "-1" and query.get("world_size", "-1") == "-1"
        forget_our_env()
        if launched(unlaunched=unranked) and config.get("TORCH_MPIGPU_AUTO_ENV") != "0":
            select_cuda_device()  # before MPI starts (rendezvous.wanted() may start it)
        if launched(unlaunched=unranked) and rendezvous.wanted():
            # no TCP store asked for: meet over MPI (rank= and world_size= are checked there)
            return rendezvous.handler(urlunparse(parts._replace(scheme=rendezvous.SCHEME)),
                                      **kwargs)
        if setup_env(unlaunched=unranked):
            # torch put rank/world_size=-1 into the URL before we could fill the environment.
            for key, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
                if query.get(key, "-1") == "-1":
                    query[key] = os.environ[var]
            url = urlunparse(parts._replace(query=urlencode(query)))
        return original(url, **kwargs)

    env_handler._mpigpu = True
    handlers["env"] = env_handler
    return True
