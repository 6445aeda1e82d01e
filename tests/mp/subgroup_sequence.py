"""The launch check of issue #25, as a user would write it: world ops, point-to-point, a subgroup
of one rank per host ([1, 3] at 2 hosts x 2 ranks) used by its members only, a world barrier,
destroy. Every result is checked against values every rank can compute."""

import torch
import torch.distributed as dist

from common import Checker, run

# The sections every rank reports (tests/test_hang_prone.py reads them from here)
WORLD_OPS, POINT_TO_POINT, SUBGROUP, AFTER = SECTIONS = (
    "world ops", "point-to-point", "subgroup of odd ranks", "world after the subgroup")


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker("subgroup_sequence")

    c.section(WORLD_OPS)
    everyone = [None] * world
    dist.all_gather_object(everyone, ("rank", rank))
    c.true("all_gather_object", everyone == [("rank", r) for r in range(world)], f"{everyone}")
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    c.true("all_reduce SUM", t.eq(world * (world + 1) / 2).all().item(), f"{t[:3].tolist()}")
    t = torch.full((7,), float(rank))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    c.true("all_reduce MAX", t.eq(world - 1).all().item(), f"{t.tolist()}")
    out = [torch.empty(3) for _ in range(world)]
    dist.all_gather(out, torch.full((3,), float(rank)))
    c.true("all_gather", all(o.eq(r).all().item() for r, o in enumerate(out)),
           f"{[o.tolist() for o in out]}")
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=world - 1)
    c.true("broadcast", b.eq(world - 1).all().item(), f"{b.tolist()}")

    c.section(POINT_TO_POINT)
    if world > 1:
        x = torch.full((11,), float(rank + 10))
        if rank == 0:
            dist.send(x, dst=world - 1)
        elif rank == world - 1:
            dist.recv(x, src=0)
        expect = 10.0 if rank == world - 1 else float(rank + 10)
        c.true("blocking send/recv", x.eq(expect).all().item(), f"{x[:3].tolist()}")
        send = torch.full((13,), float(rank))
        recv = torch.empty(13)
        reqs = [dist.isend(send, (rank + 1) % world), dist.irecv(recv, (rank - 1) % world)]
        for r in reqs:
            r.wait()
        c.true("isend/irecv ring", recv.eq((rank - 1) % world).all().item(), f"{recv[:3].tolist()}")
    else:
        c.skip("blocking send/recv", "one rank: nothing to send")
        c.skip("isend/irecv ring", "one rank: nothing to send")

    c.section(SUBGROUP)
    members = list(range(1, world, 2)) or [0]
    g = dist.new_group(members)
    if rank in members:
        s = torch.full((100,), float(rank))
        dist.all_reduce(s, group=g)
        c.true("subgroup all_reduce", s.eq(sum(members)).all().item(), f"{s[:3].tolist()}")
        bb = torch.full((9,), float(rank))
        dist.broadcast(bb, src=members[-1], group=g)
        c.true("subgroup broadcast", bb.eq(members[-1]).all().item(), f"{bb.tolist()}")
    else:
        c.skip("subgroup all_reduce", "not a member")
        c.skip("subgroup broadcast", "not a member")

    c.section(AFTER)
    dist.barrier()
    t = torch.full((3,), 1.0)
    dist.all_reduce(t)
    c.true("all_reduce after barrier", t.eq(world).all().item(), f"{t.tolist()}")
    return c.finish()  # (run() then destroys the group, as the sequence ends)


if __name__ == "__main__":
    run(main)
