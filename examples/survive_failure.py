"""DDP training that survives a dead rank, under a fault-tolerant MPI (ULFM):

    python -m torch_mpi_gpu.mpirun --fault-tolerant -np 4 examples/survive_failure.py --kill-rank 2

Every rank trains one model on its shard of a synthetic regression set. With --kill-rank R, rank R
SIGKILLs itself in the middle of an epoch (at --kill-step); the survivors' DDP step raises a
DistBackendError, they ask which ranks failed (torch_mpi_gpu.failed_ranks), shrink the default
group (torch.distributed.shrink_group), wrap their in-memory model in a new DDP over the shrunk
group, re-shard the data over the survivors, redo the step that failed and finish. At the end
every survivor checks that its parameters equal the others' (an all_gather of them) and prints
one line saying so.
Rank 0 hosts the rendezvous store: it must not be the one that dies."""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import torch_mpi_gpu


def shard(n, rank, world, epoch):
    """This rank's sample indices for `epoch`: every rank draws the same permutation."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + epoch))
    return perm[rank::world]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=3072)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--kill-rank", type=int, default=-1, help="this rank dies (never rank 0)")
    p.add_argument("--kill-step", type=int, default=-1,
                   help="the global step it dies at (default: the middle of epoch 1)")
    args = p.parse_args()

    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    me = rank  # this process's rank at the start, for its output
    if args.kill_rank == 0:
        sys.exit("--kill-rank 0: rank 0 hosts the rendezvous store; choose another rank")

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 16, generator=g)
    w_true = torch.randn(16, 1, generator=g)
    y = x @ w_true + 0.1 * torch.randn(args.samples, 1, generator=g)

    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ddp = torch.nn.parallel.DistributedDataParallel(model)

    steps_per_epoch = lambda w: args.samples // (args.batch * w)  # noqa: E731
    kill_step = args.kill_step if args.kill_step >= 0 else steps_per_epoch(world) * 3 // 2
    step = 0
    failure = None
    for epoch in range(args.epochs):
        i = 0
        while i < steps_per_epoch(world):
            idx = shard(args.samples, rank, world, epoch)[i * args.batch:(i + 1) * args.batch]
            if me == args.kill_rank and step == kill_step:
                print(f"[rank {me}] dies now: epoch {epoch} step {i} (global step {step})",
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                loss = torch.nn.functional.mse_loss(ddp(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()  # DDP all-reduces the gradients here
                total = loss.detach().clone()
                dist.all_reduce(total)
            except dist.DistBackendError as e:
                t0 = time.time()
                dead = torch_mpi_gpu.failed_ranks()
                print(f"[rank {me}] failure at epoch {epoch} step {i} (global step {step}): "
                      f"ranks {dead} failed: {str(e).splitlines()[0][:200]}", flush=True)
                dist.shrink_group(dead)
                rank, world = dist.get_rank(), dist.get_world_size()
                failure = (epoch, i, step, dead)
                # the model is in memory and equal everywhere (the failed step's update was
                # never applied): a new DDP over the shrunk default group goes on from it, and
                # the data is re-sharded over the survivors
                ddp = torch.nn.parallel.DistributedDataParallel(model)
                print(f"[rank {me}] now rank {rank} of {world}; recovered in "
                      f"{time.time() - t0:.2f} s; re-sharded, redoing the step", flush=True)
                continue
            opt.step()
            if rank == 0:
                print(f"epoch {epoch} step {i} loss {total.item() / world:.5f} ({world} ranks)",
                      flush=True)
            i += 1
            step += 1

    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    every = torch.empty(world * flat.numel())
    # torch 2.13's name, the older one before it
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(every, flat)
    equal = all(torch.equal(row, flat) for row in every.view(world, -1))
    print(f"[rank {me}] finished as rank {rank} of {world}; failure: "
          f"{'none' if failure is None else 'epoch %d step %d (global step %d), ranks %s' % failure}"
          f"; parameters equal on every survivor: {equal}", flush=True)
    dist.destroy_process_group()
    if not equal:
        sys.exit(1)


if __name__ == "__main__":
    main()
