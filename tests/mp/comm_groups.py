"""Process groups over a program's own MPI communicator (torch_mpi_gpu.init_process_group(comm=),
torch_mpi_gpu.new_group(comm=)), at 3-4 ranks, against what mpi4py says of the communicator:
two interleaved ensembles each with its own default group (results stay inside the member, in the
communicator's rank order, and a receive the program posted on its communicator is not touched
by mpigpu's traffic); a communicator in reverse rank order with a subgroup made from it; and the
errors: MPI_COMM_NULL, an intercommunicator, arguments the communicator decides, something that
is not a communicator, members outside the default group, a second default group."""

from common import Checker, run  # first: it may choose mpi4py's thread level

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import torch_mpi_gpu

WORLD = MPI.COMM_WORLD
W_RANK, W_SIZE = WORLD.Get_rank(), WORLD.Get_size()


def ensembles(c):
    c.section("two ensembles by Split, interleaved")
    member = W_RANK % 2
    comm = WORLD.Split(member, W_RANK)
    members = [r for r in range(W_SIZE) if r % 2 == member]
    # the program's own receive, posted on its communicator before mpigpu uses it
    mail = np.zeros(1, dtype=np.int32)
    posted = comm.Irecv([mail, MPI.INT], source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    torch_mpi_gpu.init_process_group(comm=comm)
    got = (dist.get_rank(), dist.get_world_size())
    c.true("rank and size are the communicator's", got == (comm.Get_rank(), comm.Get_size()),
           f"torch {got}, MPI {(comm.Get_rank(), comm.Get_size())}")
    t = torch.full((1000,), float(W_RANK))
    dist.all_reduce(t)
    c.close("all_reduce stays inside the member", t, torch.full((1000,), float(sum(members))))
    out = [torch.empty(1) for _ in members]
    dist.all_gather(out, torch.tensor([float(W_RANK)]))
    c.close("all_gather in the communicator's rank order", torch.cat(out),
            torch.tensor([float(r) for r in members]))
    dist.barrier()
    c.true("the program's posted receive is still waiting", not posted.Test())
    dist.barrier()  # every rank has looked before any rank sends
    peer = (comm.Get_rank() + 1) % comm.Get_size()
    comm.Isend([np.array([W_RANK + 1000], dtype=np.int32), MPI.INT], dest=peer, tag=5).Wait()
    posted.Wait()
    sender = members[(comm.Get_rank() - 1) % len(members)]
    c.true("the program's receive got the program's message", int(mail[0]) == sender + 1000,
           f"got {int(mail[0])}, expected {sender + 1000}")
    dist.destroy_process_group()
    comm.Free()


def reversed_order(c):
    c.section("a communicator in reverse rank order, and a subgroup from it")
    rev = WORLD.Split(0, W_SIZE - W_RANK)
    torch_mpi_gpu.init_process_group(comm=rev)
    rank = dist.get_rank()
    c.true("rank is the communicator's", rank == W_SIZE - 1 - W_RANK, f"rank {rank}")
    t = torch.tensor([float(W_RANK)])
    dist.broadcast(t, src=0)  # rank 0 is the last world rank
    c.close("broadcast from the communicator's rank 0", t, torch.tensor([float(W_SIZE - 1)]))
    pair = rev.Split(rank // 2, rank)
    group = torch_mpi_gpu.new_group(comm=pair)
    want = [g for g in range(W_SIZE) if g // 2 == rank // 2]  # default-group ranks
    c.true("the subgroup's ranks are the pair's", dist.get_process_group_ranks(group) == want,
           f"{dist.get_process_group_ranks(group)}, expected {want}")
    t = torch.full((100,), float(W_RANK))
    dist.all_reduce(t, group=group)
    pair_world = [W_SIZE - 1 - g for g in want]
    c.close("all_reduce in the subgroup", t, torch.full((100,), float(sum(pair_world))))
    dist.destroy_process_group()
    pair.Free()
    rev.Free()


def errors(c):
    c.section("errors")
    mine = {"init_process_group": torch_mpi_gpu.init_process_group,
            "new_group": torch_mpi_gpu.new_group}
    c.raises("new_group before any default group", RuntimeError,
             lambda: torch_mpi_gpu.new_group(comm=WORLD), must_contain=("new_group",
                                                                       "no default process group"))
    only_rank_0 = WORLD.Split(0 if W_RANK == 0 else MPI.UNDEFINED, W_RANK)
    if W_RANK != 0:
        c.raises("MPI_COMM_NULL", ValueError,
                 lambda: torch_mpi_gpu.init_process_group(comm=only_rank_0),
                 must_contain=("init_process_group", f"[world rank {W_RANK}]", "MPI_COMM_NULL",
                               "not a member"))
    local = WORLD.Split(W_RANK % 2, W_RANK)
    inter = local.Create_intercomm(0, WORLD, 1 - W_RANK % 2, 7)
    for op, fn in mine.items():
        c.raises(f"{op}: an intercommunicator", ValueError, lambda: fn(comm=inter),
                 must_contain=(op, f"[world rank {W_RANK}]", "intercommunicator",
                               "MPI_Intercomm_merge"))
        c.raises(f"{op}: not a communicator", TypeError, lambda: fn(comm="COMM_WORLD"),
                 must_contain=(op, "mpi4py communicator", "str"))
    c.raises("rank and world_size given", ValueError,
             lambda: torch_mpi_gpu.init_process_group(comm=WORLD, rank=0, world_size=W_SIZE),
             must_contain=("rank, world_size", "leave them out"))
    c.raises("another backend", ValueError,
             lambda: torch_mpi_gpu.init_process_group(comm=WORLD, backend="gloo"),
             must_contain=("'gloo'", "only mpigpu"))

    # a default group over one ensemble: the world has members outside it
    comm = WORLD.Split(W_RANK % 2, W_RANK)
    torch_mpi_gpu.init_process_group(comm=comm)
    c.raises("new_group with members outside the default group", ValueError,
             lambda: torch_mpi_gpu.new_group(comm=WORLD),
             must_contain=("new_group", "not in the default process group"))
    c.raises("a second default group", RuntimeError,
             lambda: torch_mpi_gpu.init_process_group(comm=comm),
             must_contain=("already has a default process group", "destroy_process_group"))
    dist.destroy_process_group()
    # and the world's own default group afterwards: MPI_COMM_WORLD's ranks again
    dist.init_process_group("mpigpu")
    c.true("a plain default group after one over a communicator", dist.get_rank() == W_RANK,
           f"rank {dist.get_rank()}, world rank {W_RANK}")
    t = torch.ones(10)
    dist.all_reduce(t)
    c.close("all_reduce over the world", t, torch.full((10,), float(W_SIZE)))
    for co in (inter, local, comm):
        co.Free()


def main():
    c = Checker(f"comm_groups(np={W_SIZE})")
    c.rank = W_RANK  # reported as the world's rank; errors() leaves the world's group for finish()
    ensembles(c)
    reversed_order(c)
    errors(c)
    return c.finish()


if __name__ == "__main__":
    run(main)
