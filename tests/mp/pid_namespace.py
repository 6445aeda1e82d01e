"""A rank of the node in a PID namespace of its own (a container that shares the host's name and
/dev/shm but not its process table, e.g. two containers of one Kubernetes pod): the peers' pids
in the node's segment name no process there, or another one. The last rank re-executes itself
under `unshare --pid --fork` before MPI starts. Checks: a node all_reduce in which that rank waits
for a late rank 0 far past the barrier's 200 ms liveness checks does not report rank 0 as exited
(its pid names no process in that namespace);
all_gather falls back from single copy (reading a peer by pid) to the slots as one group, and the
group's description says why; the results of both against values every rank computes."""

import os
import shutil
import sys
import time

INSIDE = "--in-own-pid-namespace"

if INSIDE not in sys.argv:
    import torch_mpi_gpu  # noqa: E402 (only to read the launcher's rank before MPI starts)
    placed = torch_mpi_gpu.detect_launcher() or {}
    if placed.get("rank") == placed.get("size", 0) - 1:
        unshare = shutil.which("unshare")
        if unshare is None:
            raise SystemExit("pid_namespace.py needs util-linux's unshare")
        os.execv(unshare, [unshare, "--pid", "--fork", sys.executable, *sys.argv, INSIDE])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_mpi_gpu  # noqa: E402
from common import Checker, run  # noqa: E402

LATE_S = 1.0  # past five of the barrier's liveness checks (every 200 ms)


def main():
    dist.init_process_group("mpigpu", device_id=None)
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker("pid_namespace")
    c.section("a rank in a PID namespace of its own")
    own = os.readlink("/proc/self/ns/pid")
    c.true("the last rank runs in its own PID namespace", (INSIDE in sys.argv) == (rank == world - 1),
           f"rank {rank}: {own}, argv {sys.argv}")
    for i in range(3):
        if rank == 0:
            time.sleep(LATE_S)  # the others wait for it in the node barrier
        t = torch.full((1000,), float(rank + i))
        dist.all_reduce(t)
        want = float(sum(r + i for r in range(world)))
        c.true(f"node all_reduce #{i} with a late rank", bool(t.eq(want).all()), f"got {t[:3].tolist()}")
    n = 8192  # 32 KiB per rank: single copy's size, were it available
    out = torch.empty(world * n)
    dist.all_gather_into_tensor(out, torch.full((n,), float(rank)))
    c.true("all_gather", bool(out.eq(torch.arange(world).float().repeat_interleave(n)).all()),
           f"got {out[::n].tolist()}")
    described = dist.group.WORLD._get_backend(torch.device("cpu")).describe()
    c.true("single copy off, and the description says why",
           "single copy unavailable: local rank" in described and "runs in another PID namespace" in described
           and torch_mpi_gpu._C.node_waits()["single_copy_reads"] == 0, described)
    dist.destroy_process_group()
    return c.finish()


if __name__ == "__main__":
    run(main)
