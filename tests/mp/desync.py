"""Desync detection (TORCH_MPIGPU_DESYNC_CHECK=1): ranks issuing different collectives, dtypes, sizes or
roots get a DistBackendError on every rank naming the ranks that differ, instead of a hang or
corrupted memory; the group keeps working. 2-4 ranks."""

import torch
import torch.distributed as dist

from common import Checker, run


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"desync(np={world})")
    last = world - 1
    odd = rank == last  # the rank that does something different

    def mismatch(case, fn, must):
        c.raises(case, dist.DistBackendError, fn,
                 must_contain=["not issuing the same collective", f"rank {last}: ",
                               "<- differs from rank 0", f"[rank {rank}]", *must])
        t = torch.ones(3)  # the group still works afterwards
        dist.all_reduce(t)
        c.close(f"{case}: group works after", t, torch.full((3,), float(world)))

    mismatch("size", lambda: dist.all_reduce(torch.ones(5 if odd else 4)),
             ["5 elements", "4 elements"])
    mismatch("dtype", lambda: dist.all_reduce(torch.ones(4, dtype=torch.float64 if odd else torch.float32)),
             ["Double", "Float"])
    mismatch("op", lambda: dist.broadcast(torch.ones(4), src=0) if odd else dist.all_reduce(torch.ones(4)),
             ["BROADCAST", "ALLREDUCE"])
    mismatch("root", lambda: dist.broadcast(torch.ones(4), src=1 if odd else 0),
             ["root 1", "root 0"])
    # matching calls pass the check (uneven all_to_all splits are allowed to differ)
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, async_op=True).wait()
    c.close("matching ops pass", t, torch.full((2,), float(sum(range(world)))))
    out = torch.empty(sum(r + 1 for r in range(world)))
    dist.all_to_all_single(out, torch.full((world * (rank + 1),), float(rank)),
                           [r + 1 for r in range(world)], [rank + 1] * world)
    c.close("uneven all_to_all passes the check", out,
            torch.cat([torch.full((r + 1,), float(r)) for r in range(world)]))
    # all_gather inputs of different sizes, reduce_scatter blocks of different sizes, and sparse
    # tensors whose nonzeros differ are matching calls too
    outs = [torch.empty(r + 1) for r in range(world)]
    dist.all_gather(outs, torch.full((rank + 1,), float(rank)))
    c.close("uneven all_gather passes the check", torch.cat(outs),
            torch.cat([torch.full((r + 1,), float(r)) for r in range(world)]))
    out = torch.empty(rank + 1)
    dist.reduce_scatter(out, [torch.ones(r + 1) for r in range(world)])
    c.close("uneven reduce_scatter passes the check", out, torch.full((rank + 1,), float(world)))
    s = torch.sparse_coo_tensor([[rank] * (rank + 1)], [1.0] * (rank + 1), (world,))
    dist.all_reduce(s)
    c.close("sparse all_reduce passes the check", s.to_dense(),
            torch.arange(1, world + 1, dtype=torch.float32))
    return c.finish()


if __name__ == "__main__":
    run(main)
