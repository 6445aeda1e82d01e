"""Groups split from a parent (torch's split_group, and DeviceMesh where the default group has a
device_id, which makes it split): members, rank order, ranks in no child, splits of a split, new
groups beside them, and split_ranks that differ between ranks (a ValueError on the ranks it
affects, then the job goes on). torch lets a group split only when it is bound to an accelerator
(init_process_group(device_id=...)), so this runs on the tests' own device (MPIGPU_TEST_DEVICE=own)
or on CUDA (cuda); results are checked against sums and rank lists computed here."""

import torch
import torch.distributed as dist

from common import TEST_DEVICE, Checker, run

MEMBER_OF_NONE = (None, dist.GroupMember.NON_GROUP_MEMBER)


def bound_device():
    if TEST_DEVICE == "own":
        return torch.device("owndev", 0)
    if TEST_DEVICE == "cuda":
        from torch_mpi_gpu.launcher import select_cuda_device
        index = select_cuda_device()
        return torch.device("cuda", torch.cuda.current_device() if index is None else index)
    raise RuntimeError(f"split_groups.py needs MPIGPU_TEST_DEVICE=own or cuda, not {TEST_DEVICE}")


def check_child(c, case, group, members, device):
    """`group` holds global ranks `members` (as a set); its rank order is torch's own record,
    which every op must follow. Reductions and gathers on the bound device and on the host."""
    ranks = dist.get_process_group_ranks(group)
    c.true(f"{case}: members", sorted(ranks) == sorted(members), f"{ranks} vs {members}")
    me = dist.get_rank()
    c.true(f"{case}: rank", dist.get_rank(group) == ranks.index(me),
           f"{dist.get_rank(group)} vs {ranks.index(me)} of {ranks}")
    c.true(f"{case}: size", dist.get_world_size(group) == len(ranks))
    for where in (device, torch.device("cpu")):
        t = torch.full((5,), float(me + 1), device=where)
        dist.all_reduce(t, group=group)
        c.close(f"{case}: all_reduce on {where.type}", t,
                torch.full((5,), float(sum(r + 1 for r in ranks))))
        out = torch.empty(len(ranks) * 3, device=where)
        dist.all_gather_into_tensor(out, torch.full((3,), float(me), device=where), group=group)
        c.close(f"{case}: all_gather order on {where.type}", out,
                torch.tensor([float(r) for r in ranks for _ in range(3)]))
    root = ranks[-1]
    b = torch.full((4,), float(me), device=device)
    dist.broadcast(b, src=root, group=group)
    c.close(f"{case}: broadcast from global rank {root}", b, torch.full((4,), float(root)))


def main():
    device = bound_device()
    dist.init_process_group("mpigpu", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"split_groups(np={world}, device={device.type})")

    c.section("split into even and odd ranks")
    halves = [list(range(0, world, 2)), list(range(1, world, 2))]
    child = dist.split_group(split_ranks=[h for h in halves if h])
    check_child(c, "even/odd", child, halves[rank % 2], device)

    c.section("split with ranks listed high to low")
    # torch 2.13 sorts each list, 2.14 keeps the order as the child's rank order: either way
    # the child's ops follow torch's record of it (check_child)
    reversed_all = dist.split_group(split_ranks=[list(range(world - 1, -1, -1))])
    check_child(c, "high to low", reversed_all, list(range(world)), device)

    c.section("a rank in no child")
    pair = dist.split_group(split_ranks=[[0, 1]])
    if rank < 2:
        check_child(c, "pair", pair, [0, 1], device)
    else:
        c.true("outside the pair: no group", pair in MEMBER_OF_NONE, repr(pair))

    c.section("a split of a split")
    # the even/odd child split again: its first member alone, the others together
    mine = dist.get_process_group_ranks(child)
    grandchild = dist.split_group(parent_pg=child, split_ranks=[[0], list(range(1, len(mine)))]
                                  if len(mine) > 1 else [[0]])
    expect = [mine[0]] if dist.get_rank(child) == 0 else mine[1:]
    check_child(c, "split of a split", grandchild, expect, device)

    c.section("new_group beside splits")
    # with a bound device and a backend that splits, torch has ranks outside a new group call
    # the backend's perform_nocolor_split
    first_two = dist.new_group([0, 1])
    if rank < 2:
        check_child(c, "new_group of 0 and 1", first_two, [0, 1], device)
    else:
        c.true("outside new_group: no group", first_two in MEMBER_OF_NONE, repr(first_two))

    if world % 2 == 0:
        c.section("DeviceMesh 2-D through splits")
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("dp", "tp"))
        row, col = divmod(rank, world // 2)
        check_child(c, "mesh tp", mesh.get_group("tp"),
                    [row * (world // 2) + j for j in range(world // 2)], device)
        check_child(c, "mesh dp", mesh.get_group("dp"), [i * (world // 2) + col for i in range(2)],
                    device)

    if world >= 3:
        c.section("split_ranks that differ between ranks")
        # the last rank pairs itself with 0 while the others pair 0 with 1: the ranks MPI puts
        # together (0, 1 and the last) match neither list, so all three get a ValueError; the
        # ranks in neither pair get no group; then the job goes on
        asked = [[0, world - 1]] if rank == world - 1 else [[0, 1]]
        if rank in (0, 1, world - 1):
            c.raises("differing split_ranks", ValueError,
                     lambda: dist.split_group(split_ranks=asked),
                     must_contain=("split_group", f"[rank {rank}]", "same split_ranks"))
        else:
            c.true("differing split_ranks, outside both",
                   dist.split_group(split_ranks=asked) in MEMBER_OF_NONE)
        t = torch.ones(2, device=device)
        dist.all_reduce(t)
        c.close("the default group after the failed split", t, torch.full((2,), float(world)))

    for g in (grandchild, pair, reversed_all, child, first_two):
        if g not in MEMBER_OF_NONE:
            dist.destroy_process_group(g)
    return c.finish()


if __name__ == "__main__":
    run(main)
