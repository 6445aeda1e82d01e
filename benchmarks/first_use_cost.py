"""Where a job's first seconds go before its work runs at speed: each step of a rank's start and
its first ops, timed on every rank (#24: a GPU test's launch took ~10 s outside its checks on the
lent H200, and `ddp.py`'s first training 13-21 s against 0.1-0.4 s for each later one, with the
suite's 4 workers sharing the GPU; run alone, this says which step is slow by itself and which only
under that crowd). What a user's job waits for before its first training step, too.

    mpirun -np 2 python benchmarks/first_use_cost.py [--device cuda|cpu] [--mib 16]

Steps, in order, each its own wall time (the device synchronized at its end): importing torch,
then torch_mpi_gpu; choosing the CUDA device; init_process_group; the device's first tensor (CUDA:
the context); the first 4-byte all_reduce (CUDA: the path's setup, the CUDA-awareness probe) and a
second; the first all_reduce of MIB MiB (node slots where auto takes the node algorithm) and a
second; a DDP model made (the tests' `ddp.py` MLP: DDP's shape check and parameter broadcast, and
torch importing torch._dynamo, 1.1 s of the 2-core VM's 2.2) and its first and second training
steps; destroy_process_group. Rank 0 prints each step's time on rank 0 and the slowest rank's.
`--device cpu` runs the same with host tensors (the tests run it so)."""

import time

STARTED = time.monotonic()

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

TORCH_IMPORTED = time.monotonic()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--mib", type=int, default=16)
    args = ap.parse_args()
    steps = [("import torch", TORCH_IMPORTED - STARTED)]
    since = time.monotonic()

    def step(name, sync=None):
        nonlocal since
        if sync is not None:
            sync()
        now = time.monotonic()
        steps.append((name, now - since))
        since = now

    import torch_mpi_gpu
    step("import torch_mpi_gpu")
    if args.device == "cuda":
        torch_mpi_gpu.select_cuda_device()  # (what init_process_group does itself, made a step)
        step("CUDA device chosen")
    dist.init_process_group("mpigpu")
    step("init_process_group")
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rank, world = dist.get_rank(), dist.get_world_size()
    small = torch.ones(1, device=device)
    step("first tensor on the device", sync)
    for which in ("first", "second"):
        dist.all_reduce(small)
        step(f"{which} all_reduce, 4 B", sync)
    big = torch.ones(args.mib << 18, device=device)
    sync()
    since = time.monotonic()
    for which in ("first", "second"):
        dist.all_reduce(big)
        step(f"{which} all_reduce, {args.mib} MiB", sync)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                              torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(device)
    sync()
    since = time.monotonic()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    step("DDP model made", sync)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = torch.randn(8, 20, device=device), torch.randn(8, 4, device=device)
    for which in ("first", "second"):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        step(f"{which} DDP training step", sync)
    # the results must be right: every rank summed ones (a wrong number is not a cost)
    want = float(world ** 2)
    wrong = int((small != want).sum()) + int((big != want).sum())
    times = [None] * world
    dist.all_gather_object(times, [t for _, t in steps])
    since = time.monotonic()
    dist.destroy_process_group()
    destroyed = time.monotonic() - since
    if rank == 0:
        where = torch.cuda.get_device_name() if device.type == "cuda" else "host tensors"
        print(f"# first use, {world} ranks, {where}: seconds per step (rank 0, and the slowest "
              "rank)")
        print(f"{'step':<34} {'rank 0':>8} {'slowest':>8}")
        for i, (name, mine) in enumerate(steps):
            print(f"{name:<34} {mine:>8.3f} {max(t[i] for t in times):>8.3f}")
        print(f"{'destroy_process_group':<34} {destroyed:>8.3f} {'':>8}")
        print(f"{'in all, rank 0':<34} {sum(t for _, t in steps) + destroyed:>8.3f}")
        if wrong:
            print(f"WRONG RESULTS: {wrong} elements")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
