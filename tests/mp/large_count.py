"""Counts above 2^31-1 elements (marked slow; about 6 GiB of memory at 2 ranks)."""

import torch
import torch.distributed as dist

from common import Checker, run


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"large_count(np={world})")
    n = 2**31 + 3
    t = torch.ones(n, dtype=torch.int8)
    dist.all_reduce(t)
    c.true("all_reduce > INT_MAX elements", bool((t == world).all()))
    t.fill_(rank)
    dist.broadcast(t, src=world - 1)
    c.true("broadcast > INT_MAX elements", bool((t == world - 1).all()))
    del t
    if world == 2:
        t = torch.full((n,), rank + 1, dtype=torch.int8)
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        c.true("send/recv > INT_MAX elements", bool((t == 1).all()))
    return c.finish()


if __name__ == "__main__":
    run(main)
