"""torch's shrink_group on mpigpu: the ranks that stay get a group of them (renumbered in order),
the excluded ranks take no part. A subgroup shrunk by one rank (two at 4 ranks), every collective
and point-to-point on what is left, checked against values computed here; a shrink whose parent
still waits on a receive from the excluded rank, with SHRINK_ABORT (the receive fails, the new
group works); and the default group shrunk, after which torch's global ranks are renumbered: new
groups and point-to-point must reach the processes those new ranks name. Every rank reports every
section: an excluded rank checks that it is refused if it calls shrink_group itself."""

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import SHRINK_ABORT

from common import Checker, run

# torch 2.13's names (the older ones warn there); shrink_group itself needs torch >= 2.10
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def check_group(c, case, group, world_ranks):
    """`group` must hold exactly the processes `world_ranks` (their ranks at the start), in that
    order, and carry every op among them."""
    me = WORLD_RANK
    n = len(world_ranks)
    mine = world_ranks.index(me)
    c.true(f"{case}: size", dist.get_world_size(group) == n, f"{dist.get_world_size(group)} != {n}")
    c.true(f"{case}: rank", dist.get_rank(group) == mine, f"{dist.get_rank(group)} != {mine}")
    t = torch.full((5,), float(me + 1))
    dist.all_reduce(t, group=group)
    c.close(f"{case}: all_reduce", t, torch.full((5,), float(sum(r + 1 for r in world_ranks))))
    out = torch.empty(n * 3)
    all_gather_single(out, torch.full((3,), float(me)), group=group)
    c.close(f"{case}: all_gather (who is where)", out,
            torch.tensor([float(r) for r in world_ranks for _ in range(3)]))
    rs_in = torch.arange(n * 2, dtype=torch.float64) + 100 * me
    rs_out = torch.empty(2, dtype=torch.float64)
    reduce_scatter_single(rs_out, rs_in, group=group)
    c.close(f"{case}: reduce_scatter", rs_out, torch.arange(mine * 2, mine * 2 + 2,
            dtype=torch.float64) * n + 100 * sum(world_ranks))
    b = torch.full((4,), float(me))
    dist.broadcast(b, group_src=n - 1, group=group)
    c.close(f"{case}: broadcast from its last rank", b, torch.full((4,), float(world_ranks[-1])))
    a_in = torch.tensor([float(me * 10 + j) for j in range(n)])
    a_out = torch.empty(n)
    dist.all_to_all_single(a_out, a_in, group=group)
    c.close(f"{case}: all_to_all", a_out, torch.tensor([float(r * 10 + mine) for r in world_ranks]))
    # a ring of sends and receives by group rank
    send = torch.tensor([float(me)])
    recv = torch.empty(1)
    ops = [dist.P2POp(dist.isend, send, group_peer=(mine + 1) % n, group=group),
           dist.P2POp(dist.irecv, recv, group_peer=(mine - 1) % n, group=group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    c.close(f"{case}: send/recv ring", recv, torch.tensor([float(world_ranks[(mine - 1) % n])]))


def excluded_is_refused(c, group):
    c.raises("an excluded rank calling shrink_group is refused", RuntimeError,
             lambda: dist.shrink_group([WORLD_RANK], group=group), ("exclusion list",))


# The sections every rank reports (tests/test_multirank.py reads them from here)
SUBGROUP_SHRUNK, ABORTED, DEFAULT_SHRUNK = SECTIONS = (
    "a subgroup shrunk", "SHRINK_ABORT fails an op waiting for the excluded rank",
    "the default group shrunk: global ranks renumbered")


def main():
    global WORLD_RANK
    dist.init_process_group("mpigpu")
    WORLD_RANK, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"shrink(np={world})")

    # Every group that holds an excluded rank is made before the first shrink: from torch 2.14 a
    # shrink advances torch's group counter on the ranks that stay only, so groups made later
    # get other names there than on the excluded ranks (and would wait for each other forever)
    parent, parent2 = dist.new_group(list(range(world))), dist.new_group(list(range(world)))

    c.section(SUBGROUP_SHRUNK)
    out = [1, world - 1] if world >= 4 else [1]
    if WORLD_RANK in out:
        excluded_is_refused(c, parent)
    else:
        child = dist.shrink_group(out, group=parent)
        check_group(c, f"without {out}", child, [r for r in range(world) if r not in out])
        c.true("the shrunk group's members", dist.get_process_group_ranks(child) ==
               [r for r in range(world) if r not in out], str(dist.get_process_group_ranks(child)))
        # (torch 2.13 names a shrunk group by its parent's ranks and the count of live groups:
        # with this one alive, the next shrink of the same ranks would get its name)
        dist.destroy_process_group(child)
    dist.barrier()

    c.section(ABORTED)
    gone = world - 1
    parent = parent2
    if WORLD_RANK == gone:
        excluded_is_refused(c, parent)
    else:
        never = torch.empty(3)
        waiting = dist.irecv(never, src=gone, group=parent)  # the excluded rank never sends
        child = dist.shrink_group([gone], group=parent, shrink_flags=SHRINK_ABORT)
        c.raises("the receive from the excluded rank fails", Exception, waiting.wait, ("abort",))
        check_group(c, "after SHRINK_ABORT", child, list(range(world - 1)))
        dist.destroy_process_group(child)
    dist.barrier()

    c.section(DEFAULT_SHRUNK)
    if WORLD_RANK == gone:
        excluded_is_refused(c, None)
        c.true("the excluded rank keeps its own view", dist.get_world_size() == world)
        return c.finish()
    dist.shrink_group([gone])
    stay = list(range(world - 1))
    c.true("new world size", dist.get_world_size() == world - 1, str(dist.get_world_size()))
    check_group(c, "shrunk default group", None, stay)
    # a group made afterwards names torch's new global ranks: here the last two that stayed
    pair = stay[-2:]
    g = dist.new_group(pair)
    if WORLD_RANK in pair:
        check_group(c, f"new_group({pair}) after the shrink", g, pair)
    else:
        c.true("outside the new pair", dist.get_rank(g) < 0, str(dist.get_rank(g)))
    return c.finish()


if __name__ == "__main__":
    run(main)
