"""The main job: DDP training of a small MLP over mpigpu, under mpirun, on the CPU.

    mpirun -np 4 python examples/ddp_train.py [--epochs 5]

Data is generated (a fixed random teacher network labels Gaussian inputs), so nothing is
downloaded. Rank 0 prints loss, accuracy and time per epoch, and the job checks at the end that
every rank holds identical parameters.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_mpi_gpu


def make_data(n, features=64, classes=10, seed=0):
    """Inputs drawn with `seed`, labelled by one fixed teacher shared by train and test sets."""
    teacher = torch.randn(features, classes, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))
    return x, (x @ teacher).argmax(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=128, help="per rank")
    parser.add_argument("--samples", type=int, default=32768)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        info = torch_mpi_gpu.info()
        print(f"mpigpu DDP: {world} ranks, {info['mpi_library'].split(',')[0]}, "
              f"{info['mpi_thread_level']}, torch {info['torch']}", flush=True)

    x, y = make_data(args.samples)
    xt, yt = make_data(4096, seed=1)
    shard = slice(rank, None, world)  # each rank trains on its own slice of the data
    xs, ys = x[shard], y[shard]

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = len(xs) // args.batch
    for epoch in range(args.epochs):
        start = time.perf_counter()
        perm = torch.randperm(len(xs), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(1)
        for s in range(steps):
            idx = perm[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            total += loss.detach()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        with torch.no_grad():
            acc = (model.module(xt).argmax(1) == yt).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {total.item() / steps:.4f}  test accuracy {acc:.3f}  "
                  f"{elapsed.item():.2f} s  {steps * args.batch * world / elapsed.item():,.0f} samples/s",
                  flush=True)

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    if rank == 0:
        print(f"parameters identical on all {world} ranks: {same}")
    dist.destroy_process_group()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
