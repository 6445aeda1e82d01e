"""What mpigpu read from the launcher: RANK/WORLD_SIZE equal MPI's; on each host the LOCAL_RANKs
are 0..n-1, each once, and LOCAL_WORLD_SIZE is n (from the host names every rank reports; the
launcher may order local ranks its own way); the launcher is the one expected (argv[1]); the job spans argv[2] hosts; the group met over
MPI with no MASTER_ADDR (with TORCH_MPIGPU_MASTER_PORT, a TCP store: MASTER_ADDR is reachable); a group of ranks on different hosts works. Run by test_multirank.py under each
launcher."""

import os
import socket
import sys

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, run


def main():
    expected_launcher, expected_hosts = sys.argv[1], int(sys.argv[2])
    found = torch_mpi_gpu.launcher.detect_launcher()
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker("launch_env")
    mpi = torch_mpi_gpu._C.mpi_info()
    c.true("RANK", int(os.environ["RANK"]) == rank == mpi["world_rank"],
           f"RANK={os.environ['RANK']} group rank {rank} MPI rank {mpi['world_rank']}")
    c.true("WORLD_SIZE", int(os.environ["WORLD_SIZE"]) == world == mpi["world_size"],
           f"WORLD_SIZE={os.environ['WORLD_SIZE']} MPI size {mpi['world_size']}")
    c.true("launcher", found and found["launcher"] == expected_launcher,
           f"detected {found}, expected {expected_launcher}")

    everyone = [None] * world
    dist.all_gather_object(everyone, (socket.gethostname(), int(os.environ["LOCAL_RANK"])))
    hosts = [h for h, _ in everyone]
    mine = hosts[rank]
    local_ranks = sorted(lr for h, lr in everyone if h == mine)
    local_size = hosts.count(mine)
    c.true("LOCAL_RANK", local_ranks == list(range(local_size)),
           f"local ranks on {mine}: {local_ranks} (every rank: {everyone})")
    c.true("LOCAL_WORLD_SIZE", int(os.environ["LOCAL_WORLD_SIZE"]) == local_size,
           f"LOCAL_WORLD_SIZE={os.environ['LOCAL_WORLD_SIZE']}, {local_size} ranks on {mine}")
    c.true("hosts", len(set(hosts)) == expected_hosts, f"hosts {hosts}, expected {expected_hosts}")
    want_port = os.environ.get("TORCH_MPIGPU_MASTER_PORT")
    if want_port:
        c.true("TORCH_MPIGPU_MASTER_PORT", os.environ["MASTER_PORT"] == want_port,
               f"MASTER_PORT={os.environ['MASTER_PORT']}, asked for {want_port}")
    if want_port:
        # a TCP store asked for: one host, loopback; several, an address every rank reaches
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        try:
            socket.create_connection((addr, port), timeout=5).close()
            reached = "connected"
        except OSError as e:
            reached = f"cannot connect: {e}"
        c.true("MASTER_ADDR", (addr == "127.0.0.1") == (expected_hosts == 1)
               and reached == "connected",
               f"MASTER_ADDR={addr}:{port} on {expected_hosts} host(s): {reached}")
    else:
        # the default: the group met over MPI, with no address or port
        store = dist.distributed_c10d._get_default_store()
        while hasattr(store, "underlying_store"):
            store = store.underlying_store
        c.true("met over MPI", isinstance(store, torch_mpi_gpu._C.MPIStore)
               and "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ,
               f"{type(store).__name__}, MASTER_ADDR={os.environ.get('MASTER_ADDR')}")

    # a group of one rank per host (ranks 0 and the last: on different hosts when there are two)
    members = sorted({0, world - 1})
    group = dist.new_group(members)
    t = torch.full((1000,), float(rank + 1))
    if rank in members:
        dist.all_reduce(t, group=group)
    expected = sum(r + 1 for r in members) if rank in members else rank + 1
    c.true("new_group across hosts", t.eq(expected).all().item(), f"got {t[:4].tolist()}")
    dist.barrier()
    print(f"[rank {rank}] host {mine} RANK {os.environ['RANK']} LOCAL_RANK "
          f"{os.environ['LOCAL_RANK']}/{os.environ['LOCAL_WORLD_SIZE']} MASTER_ADDR "
          f"{os.environ.get('MASTER_ADDR')} launcher {found and found['launcher']}", flush=True)
    return c.finish()


if __name__ == "__main__":
    run(main)
