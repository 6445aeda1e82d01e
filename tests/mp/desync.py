"""Desync detection: ranks issuing different collectives, dtypes, sizes, roots or reduce ops get a
DistBackendError on every rank naming the ranks that differ, instead of a hang or corrupted memory;
the group keeps working. 2-4 ranks. Under the default (TORCH_MPIGPU_DESYNC_CHECK=auto) a mismatch
in the group's first collectives is caught before it runs, and one after them (a reduce op that
differs: no hang, silently wrong data without the check) within one check interval, naming the
collective; with TORCH_MPIGPU_DESYNC_CHECK=1 every collective is compared before it runs."""

import os

import torch
import torch.distributed as dist

from common import Checker, run


def late_mismatch(c, odd, last, rank, world):
    """After the young phase: a reduce op that differs runs (it cannot hang), and a later check
    within one interval raises on every rank, naming it."""
    first = int(os.environ.get("TORCH_MPIGPU_DESYNC_CHECK_FIRST_OPS", "64"))
    interval = int(os.environ.get("TORCH_MPIGPU_DESYNC_CHECK_INTERVAL", "64"))
    t = torch.ones(2)
    for _ in range(first):  # past the collectives compared one by one
        dist.all_reduce(t)
    dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)

    def until_checked():
        for _ in range(interval + 1):
            dist.all_reduce(torch.ones(2))

    c.raises("late reduce-op mismatch found within one interval", dist.DistBackendError,
             until_checked, must_contain=["did not issue the same collective #", f"rank {last}: ",
                                          "MAX", "SUM", "<- differs from rank 0", f"[rank {rank}]"])
    t = torch.ones(3)
    dist.all_reduce(t)
    c.close("late mismatch: group works after", t, torch.full((3,), float(world)))


def p2p_mismatch(c, rank, last):
    """A receive larger than the message raises on the receiver naming the peer and both sizes
    (MPI calls it a success); one smaller (MPI's truncation error), or of a smaller dtype, raises
    naming the peer and the receive's size, under every MPI (MPICH makes a truncation in a
    multiple-completion call fatal: the engine tests each request alone). Either error says the
    tensor's contents are undefined: MPI may have written part of it."""
    if rank == 0:
        dist.send(torch.ones(2), dst=last)
        dist.send(torch.ones(4), dst=last)
        dist.send(torch.ones(4, dtype=torch.float64), dst=last)
    elif rank == last:
        c.raises("a receive larger than the message", dist.DistBackendError,
                 lambda: dist.recv(torch.zeros(4), src=0),
                 must_contain=["from rank 0", "held 8 bytes", "expects 16", "4 elements of Float",
                               "contents are undefined", f"[rank {last}]"])
        for case, t in (("a receive smaller than the message", torch.zeros(2)),
                        ("a receive of a smaller dtype than the message", torch.zeros(4))):
            c.raises(case, dist.DistBackendError, lambda: dist.recv(t, src=0),
                     must_contain=["from rank 0", "larger than this receive",
                                   f"{t.numel()} elements of Float", "contents are undefined",
                                   f"[rank {last}]"])
    t = torch.ones(3)  # the group still works afterwards
    dist.all_reduce(t)
    c.close("p2p mismatches: group works after", t, torch.full((3,), float(dist.get_world_size())))


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
    mismatch("reduce op", lambda: dist.all_reduce(torch.ones(4),
                                                  op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM),
             ["MAX", "SUM"])
    if os.environ.get("TORCH_MPIGPU_DESYNC_CHECK", "auto") == "auto":
        late_mismatch(c, odd, last, rank, world)
    p2p_mismatch(c, rank, last)
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
