"""Ranks of a node that share one CPU (unbound ranks the scheduler put together, an
oversubscribed node): a rank waiting in the node barrier for a peer last seen on its own CPU must
yield to it at once, not spin (the peer cannot arrive while it spins). argv[1]: "same" pins every
thread of every rank to CPU 0; "apart" pins rank r to its own CPU. Checks: the node algorithm's
results (all_reduce, all_gather, broadcast against values every rank can compute), and
_C.node_waits()["host_peer_on_this_cpu"]: more than half the ops counted such a wait across the
ranks when they share a CPU (the first to arrive always waits for the other), none when apart."""

import os
import sys

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, run

OPS = 200


def pin_every_thread(cpus):
    # os.sched_setaffinity takes a thread id on Linux: the engine and watchdog threads too
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def main():
    placement = sys.argv[1]
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker("shared_cpu")
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "apart" and len(cpus) < world:
        raise SystemExit(f"'apart' needs {world} CPUs, this rank may use {cpus}")
    pin_every_thread({cpus[0]} if placement == "same" else {cpus[rank]})
    dist.barrier()
    before = torch_mpi_gpu._C.node_waits()

    c.section("node collectives on the placement")
    for i in range(OPS):
        kind = i % 3
        if kind == 0:
            t = torch.full((257,), float(rank + i))
            dist.all_reduce(t)
            want = float(sum(r + i for r in range(world)))
            c.true(f"all_reduce #{i}", bool(t.eq(want).all()), f"got {t[:3].tolist()}, want {want}")
        elif kind == 1:
            out = torch.empty(world * 33, dtype=torch.int64)
            dist.all_gather_into_tensor(out, torch.full((33,), rank * 1000 + i, dtype=torch.int64))
            want = torch.arange(world).repeat_interleave(33) * 1000 + i
            c.true(f"all_gather #{i}", bool(out.eq(want).all()), f"got {out[::33].tolist()}")
        else:
            t = torch.full((65,), float(i if rank == i % world else -1))
            dist.broadcast(t, src=i % world)
            c.true(f"broadcast #{i}", bool(t.eq(float(i)).all()), f"got {t[:3].tolist()}")

    after = torch_mpi_gpu._C.node_waits()
    mine = after["host_peer_on_this_cpu"] - before["host_peer_on_this_cpu"]
    host_waits = after["host"] - before["host"]
    counts = [None] * world
    dist.all_gather_object(counts, (mine, host_waits))
    c.section(f"waits for a peer on this CPU ({placement})")
    c.true("the ops took the node algorithm", host_waits >= OPS, f"{host_waits} host waits")
    total = sum(m for m, _ in counts)
    if placement == "same":
        c.true("a waiting rank yielded to its peer on its CPU", total > OPS // 2,
               f"{total} such waits in {OPS} ops (per rank: {counts})")
    else:
        c.true("no peer seen on this CPU", total == 0, f"{total} (per rank: {counts})")
    return c.finish()


if __name__ == "__main__":
    run(main)
