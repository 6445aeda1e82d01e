"""Counts above 2^31-1 elements (marked slow; about 6 GiB of memory at 2 ranks): all_reduce and
broadcast on the default group (auto: the node algorithm on one host) and again on a group with
TORCH_MPIGPU_ALGO=mpi (MPI's own collectives, large-count calls), send/recv (large-count MPI
point-to-point)."""

import os

import torch
import torch.distributed as dist

import torch_mpi_gpu

from common import Checker, run


def every_element_is(t, value):
    """min == max == value: exact, and ~30x faster than (t == value).all() on 2 GiB (no 2 GiB
    bool tensor made and scanned)."""
    low, high = torch.aminmax(t)
    return int(low) == value == int(high)


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"large_count(np={world})")
    n = 2**31 + 3
    os.environ["TORCH_MPIGPU_ALGO"] = "mpi"  # read when a group is made: this one only
    through_mpi = dist.new_group(list(range(world)))
    del os.environ["TORCH_MPIGPU_ALGO"]
    t = torch.empty(n, dtype=torch.int8)
    for label, group in (("auto", None), ("mpi", through_mpi)):
        ours_before = sum(torch_mpi_gpu._C.algorithm_runs().values())
        t.fill_(1)
        dist.all_reduce(t, group=group)
        c.true(f"all_reduce > INT_MAX elements ({label})", every_element_is(t, world))
        t.fill_(rank)
        dist.broadcast(t, src=world - 1, group=group)
        c.true(f"broadcast > INT_MAX elements ({label})", every_element_is(t, world - 1))
        if label == "mpi":
            c.true("ALGO=mpi: both ran in MPI's own collectives, none of ours",
                   sum(torch_mpi_gpu._C.algorithm_runs().values()) == ours_before)
    del t
    if world == 2:
        t = torch.full((n,), rank + 1, dtype=torch.int8)
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        c.true("send/recv > INT_MAX elements", every_element_is(t, 1))
    return c.finish()


if __name__ == "__main__":
    run(main)
