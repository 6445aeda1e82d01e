"""The node's leader keeping its peers' mappings across ops (TORCH_MPIGPU_NODE_LEADER=mapped,
TORCH_MPIGPU_NODE_MAPPED_KEEP; node/KeptMappings.hpp): all_reduce of one tensor again and again
opens each peer's allocation once (KEEP 0: every op), and new tensors after the peers gave their
memory back to the device (torch.cuda.empty_cache: a new allocation, maybe at a freed one's
address, under a new handle) come out right. Values every rank computes are the reference.
Run under mpirun on one node: CUDA IPC (test_gpu.py), or the device-slot code on host memory
(CPU CI: results and mapped ops only; its emulated mapping opens nothing)."""

import os

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, run, use_test_device


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    use_test_device()
    cuda = torch.empty(0).device.type == "cuda"
    keep = int(os.environ.get("TORCH_MPIGPU_NODE_MAPPED_KEEP", "64"))
    c = Checker(f"kept_mappings(np={world}, keep={keep})")
    waits = torch_mpi_gpu._C.node_waits
    # CUDA: 12 MiB and up, each a segment of the caching allocator's own (empty_cache frees it);
    # emulated: within the tests' 8 KiB slot, or the op would go through the slots
    n = (3 << 20) if cuda else 1000
    want, peers = float(sum(range(1, world + 1))), world - 1

    c.section("a tensor used again")
    t = torch.empty(n)
    before = waits()
    for i in range(20):
        t.fill_(float(rank + 1))
        dist.all_reduce(t)
        c.true(f"all_reduce #{i} right", bool(t.eq(want).all()), str(t[:3].tolist()))
        if i == 0:
            after_first = waits()
    after = waits()
    mapped, refused = (after[k] - before[k] for k in ("mapped_ops", "mapped_refused"))
    c.true("every op mapped, none refused", (mapped, refused) == (20, 0), f"{mapped}, {refused}")
    if cuda and rank == 0:  # the node's leader
        opened = after["mapped_opens"] - after_first["mapped_opens"]
        c.true(f"the 19 later ops opened {0 if keep else 19 * peers} of the peers' allocations",
               opened == (0 if keep else 19 * peers), str(opened))

    c.section("a peer's freed memory")
    before = waits()
    for i in range(12):
        x = torch.full((n + (i % 3) * (n // 4),), float(rank + 1))  # sizes in turn: addresses recur
        dist.all_reduce(x)
        c.true(f"all_reduce #{i} of a new tensor right", bool(x.eq(want).all()), str(x[:3].tolist()))
        del x
        if cuda:
            torch.cuda.empty_cache()  # the segment goes back: its mapping must not serve the next
    after = waits()
    if cuda and rank == 0:
        opened = after["mapped_opens"] - before["mapped_opens"]
        c.true("each new allocation opened", opened == 12 * peers, str(opened))
    dist.destroy_process_group()
    return c.finish()


if __name__ == "__main__":
    run(main)
