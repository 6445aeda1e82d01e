"""How many MPI communicators a group holds, and a job that makes more groups than its MPI allows.

An MPI caps the communicators a process may hold (MPICH and the MPIs built on it: 2048), so a
group keeps none that repeats another: on one node 2 (its own, and its algorithms'), with one rank
per node 2, across nodes with several ranks on each 4 (plus the node's and the cross-node one);
MPIGPU_EXPECT_COMMS_PER_GROUP says which, checked against torch_mpi_gpu._C.mpi_comms_held().
With MPIGPU_MAKE_GROUPS=N, groups are then made until N or until MPI refuses one: every group made
carries an all_reduce checked against its sum; a refusal is a DistBackendError naming the op, the
count held and what to do, the refused group frees what it had made (the count before it is the
count after), and once some groups are destroyed new ones work again. Under MPICH the refusal
must come, and only when the cap is used up."""

import os
import re

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, run

MPICH_CAP = 2048  # MPICH's context ids per process


def held():
    return torch_mpi_gpu._C.mpi_comms_held()


def all_reduce_checked(c, case, group, world):
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t, group=group)
    c.close(case, t, torch.full((4,), float(world * (world + 1) // 2)))


def per_group(c, world, expected):
    c.section("a group holds only the communicators it needs")
    before = held()
    g = dist.new_group(list(range(world)))
    all_reduce_checked(c, "a new group", g, world)
    c.true("communicators per group", held() - before == expected,
           f"{held() - before} held by one group, expected {expected} "
           f"(TORCH_MPIGPU_TEST_PRETEND_NODES={os.environ.get('TORCH_MPIGPU_TEST_PRETEND_NODES', '1')})")
    dist.destroy_process_group(g)
    c.true("destroy frees them all", held() == before, f"{held()} held after, {before} before")


def past_the_cap(c, world, most):
    c.section("more groups than MPI allows")
    groups, refusal, before_refused = [], None, 0
    while len(groups) < most:
        before_refused = held()
        try:
            g = dist.new_group(list(range(world)))
        except dist.DistBackendError as e:
            refusal = str(e)
            break
        groups.append(g)
        all_reduce_checked(c, f"group {len(groups)}", g, world)
    mpich = "MPICH" in torch_mpi_gpu.info()["mpi_library"]
    print(f"[rank {dist.get_rank()}] {len(groups)} groups made, {held()} communicators held, "
          f"{'refused: ' + refusal[:160] if refusal else 'none refused'}", flush=True)
    if mpich:
        c.true("MPICH refuses a group past its cap", refusal is not None,
               f"{len(groups)} groups made, {held()} communicators held")
    if refusal is not None:
        for part in ("mpigpu new_group [rank", "ran out of communicators",
                     "dist.destroy_process_group(group)"):
            c.true(f"the refusal says {part!r}", part in refusal, refusal[:600])
        # the count when the refused call ran: the group's own communicators made before it
        count = re.search(r"this process holds (\d+) made by mpigpu", refusal)
        c.true("the refusal counts the communicators held",
               count is not None and before_refused <= int(count.group(1)) <= before_refused + 3,
               f"{before_refused} held before the refused group: {refusal[:600]}")
        c.true("the refused group freed what it made", held() == before_refused,
               f"{held()} held after the refusal, {before_refused} before it")
        c.true("refused only at the cap", before_refused + 4 >= MPICH_CAP - 64 or not mpich,
               f"refused with {before_refused} held")
        for g in groups[:5]:
            dist.destroy_process_group(g)
        groups = groups[5:]
        again = dist.new_group(list(range(world)))
        all_reduce_checked(c, "a group made after destroying some", again, world)
        groups.append(again)
    for g in groups:
        dist.destroy_process_group(g)


def main():
    dist.init_process_group("mpigpu")
    world = dist.get_world_size()
    c = Checker(f"comm_cap(np={world})")
    per_group(c, world, int(os.environ["MPIGPU_EXPECT_COMMS_PER_GROUP"]))
    most = int(os.environ.get("MPIGPU_MAKE_GROUPS", "0"))
    if most:
        past_the_cap(c, world, most)
    return c.finish()


if __name__ == "__main__":
    run(main)
