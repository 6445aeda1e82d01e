"""Ensembles inside one MPI job: MPI_COMM_WORLD split into members, each training its own DDP
model over its own default process group (torch_mpi_gpu.init_process_group(comm=...)).

    mpirun -np 4 python examples/ensembles.py [--members 2] [--steps 20]

Member m holds the world ranks r with r % members == m, so members interleave across hosts as
a scientific code's ensembles often do. Each member draws its own model and data from seed m.
At the end every rank trains its member's model again in one process on the member's whole
batch (float64, no communication) and checks that DDP reached the same parameters; the job
exits non-zero if any rank's differ, and prints one line per member.
"""

import argparse

from mpi4py import MPI

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_mpi_gpu

PER_RANK = 16


def make_model(member):
    torch.manual_seed(100 + member)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def batches(member, size, steps):
    g = torch.Generator().manual_seed(member)
    return [(torch.randn(PER_RANK * size, 16, generator=g),
             torch.randn(PER_RANK * size, 4, generator=g)) for _ in range(steps)]


def train(net, data, rows=slice(None)):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in data:
        opt.zero_grad()
        x, y = x[rows].to(next(net.parameters()).dtype), y[rows].to(next(net.parameters()).dtype)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach() for p in net.parameters()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    world_rank, world_size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if world_size % args.members:
        raise SystemExit(f"{world_size} ranks do not split into {args.members} equal members")
    torch.set_num_threads(1)

    member = world_rank % args.members
    comm = MPI.COMM_WORLD.Split(color=member, key=world_rank)
    torch_mpi_gpu.init_process_group(comm=comm)
    rank, size = dist.get_rank(), dist.get_world_size()
    assert (rank, size) == (comm.Get_rank(), comm.Get_size())

    data = batches(member, size, args.steps)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    got = train(DDP(make_model(member)), data, mine)
    want = train(make_model(member).double(), data)  # one process, the member's whole batch
    worst = max((g.double() - w).abs().max().item() for g, w in zip(got, want))
    ok = worst < 1e-5
    dist.destroy_process_group()

    # one line per member, from its first rank; the verdict of every rank decides the exit
    results = MPI.COMM_WORLD.gather((member, world_rank, ok, worst, got[0].flatten()[0].item()))
    if world_rank == 0:
        for m in range(args.members):
            ranks = [r for mm, r, *_ in results if mm == m]
            first = next(res for res in results if res[0] == m)
            max_diff = max(res[3] for res in results if res[0] == m)
            verdict = "equal to" if all(res[2] for res in results if res[0] == m) else "DIFFERS FROM"
            print(f"member {m} (world ranks {ranks}): {args.steps} DDP steps on {len(ranks)} "
                  f"ranks, parameters {verdict} its single-process reference (max difference "
                  f"{max_diff:.1e}); first weight {first[4]:+.6f}", flush=True)
    if not MPI.COMM_WORLD.allreduce(ok, op=MPI.LAND):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
