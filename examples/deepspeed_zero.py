"""DeepSpeed ZeRO (stage 1, 2 or 3) over mpigpu, on the CPU, under mpirun:

    python -m torch_mpi_gpu.mpirun -np 2 examples/deepspeed_zero.py --stage 3
    python -m torch_mpi_gpu.mpirun -np 2 examples/deepspeed_zero.py --stage 1 --init deepspeed

A small MLP trains a few SGD steps, each rank on its own shard of every batch; at the end every
rank checks that its parameters equal single-process training on the whole batches (computed
here, without DeepSpeed) and prints "deepspeed zero-N: OK". --init torch (default) makes the group
first with dist.init_process_group("mpigpu"); --init deepspeed has DeepSpeed make it
(deepspeed.init_distributed(dist_backend="mpigpu")). Needs `pip install deepspeed`.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import torch_mpi_gpu  # registers "mpigpu"

STEPS, PER_RANK, LR = 4, 8, 0.1


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def batches(world):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(PER_RANK * world, 6, generator=g),
             torch.randn(PER_RANK * world, 2, generator=g)) for _ in range(STEPS)]


def reference(world):
    """Single-process SGD on the whole batches: what every rank must end with."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for x, y in batches(world):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", type=int, choices=(1, 2, 3), default=1)
    parser.add_argument("--init", choices=("torch", "deepspeed"), default="torch")
    parser.add_argument("--backend", choices=("mpigpu", "gloo"), default="mpigpu",
                        help="gloo: the control, on one host (a TCP store on 127.0.0.1)")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no GPU here: DeepSpeed's CPU accelerator
    torch.set_num_threads(1)
    import deepspeed

    if args.backend == "gloo":
        job = torch_mpi_gpu.launcher.detect_launcher()
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517",
                                rank=int(job["rank"]), world_size=int(job["size"]))
    elif args.init == "torch":
        dist.init_process_group("mpigpu")  # DeepSpeed then uses this group
    else:
        deepspeed.init_distributed(dist_backend="mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == args.backend, dist.get_backend()

    net = model()
    # gradient_clipping 0: DeepSpeed clips to a global norm of 1.0 unless told otherwise, which
    # plain SGD (the reference) does not
    config = {"train_micro_batch_size_per_gpu": PER_RANK, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": args.stage}, "zero_allow_untested_optimizer": True,
              "gradient_clipping": 0.0, "steps_per_print": 10**6}
    engine, _, _, _ = deepspeed.initialize(
        model=net, optimizer=torch.optim.SGD(net.parameters(), lr=LR), config=config)
    shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for x, y in batches(world):
        loss = torch.nn.functional.mse_loss(engine(x[shard]), y[shard])
        engine.backward(loss)
        engine.step()

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=args.stage == 3):
        got = [p.detach().clone() for p in params]
    expected = reference(world)
    worst = max(float((a - b).abs().max()) for a, b in zip(got, expected))
    ok = len(got) == len(expected) and worst <= 1e-5
    print(f"[rank {rank}/{world}] deepspeed zero-{args.stage} over {args.backend} (init: {args.init}): "
          f"{'OK' if ok else 'WRONG'}, largest difference from single-process training {worst:.2e}",
          flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
