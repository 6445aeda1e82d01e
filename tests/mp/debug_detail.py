"""Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps the backend in its ProcessGroupWrapper, which
compares every collective's sequence number across ranks. Point-to-point ops differ from rank to
rank, so they must not advance that number: rank 0 sends to every other rank, then all ranks
all_reduce (before the fix: "Detected mismatch between collectives ... Sequence number: 2vs 1").
Run by test_multirank.py at 3 ranks with TORCH_DISTRIBUTED_DEBUG=DETAIL."""

import os

import torch
import torch.distributed as dist

from common import Checker, run


def main():
    assert os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker("debug_detail")
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    before = backend._get_sequence_number_for_group()
    t = torch.full((8,), float(rank))
    if rank == 0:
        for peer in range(1, world):
            dist.send(torch.full((8,), 10.0 + peer), dst=peer)
    else:
        dist.recv(t, src=0)
        c.close("recv", t, torch.full((8,), 10.0 + rank))
    c.true("p2p leaves the collective number", backend._get_sequence_number_for_group() == before,
           f"{before} -> {backend._get_sequence_number_for_group()}")
    for i in range(3):
        x = torch.full((16,), float(rank + i))
        dist.all_reduce(x)
        c.close(f"all_reduce {i}", x, torch.full((16,), float(sum(range(world)) + world * i)))
    x = torch.arange(4.0) + rank
    dist.broadcast(x, src=world - 1)
    c.close("broadcast", x, torch.arange(4.0) + world - 1)
    c.true("collectives counted", backend._get_sequence_number_for_group() == before + 4,
           f"{before} -> {backend._get_sequence_number_for_group()}")
    return c.finish()


if __name__ == "__main__":
    run(main)
