"""What the desync check costs (ops/Desync.hpp): the same ops on three groups of the same ranks, one
per TORCH_MPIGPU_DESYNC_CHECK value (0: off, auto: the default, 1: every collective compared),
interleaved round by round so that the machine's noise falls on all three alike.

    mpirun -np 2 python benchmarks/desync_cost.py [--rounds 15] [--ops 256] [--out [DIR]]

Per size: the mean time of one all_reduce over --ops back-to-back calls (a mean, not a median:
`auto` compares one op in DESYNC_CHECK_INTERVAL, so its cost is spread over all of them), the
median over rounds, slowest rank; and one DDP training step of a small MLP. The groups are past
their young phase (DESYNC_CHECK_FIRST_OPS) before timing starts. Prints a table with the ratios
to `0`; --out writes it and its JSON into a run folder with a manifest.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_mpi_gpu  # noqa: F401
from torch_mpi_gpu.manifest import run_paths, write_manifest

MODES = ("0", "auto", "1")
SIZES = (8, 64 << 10, 16 << 20)


def group_with(mode):
    os.environ["TORCH_MPIGPU_DESYNC_CHECK"] = mode  # read when the group is made, on every rank
    return dist.new_group(backend="mpigpu")


def mean_op(group, t, ops):
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(ops):
        dist.all_reduce(t, group=group)
    mine = torch.tensor([(time.perf_counter() - start) / ops], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's
    return mine.item()


def ddp_step_time(group, steps):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10)), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    mine = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return mine.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", type=int, default=256, help="all_reduces per round and size")
    ap.add_argument("--steps", type=int, default=20, help="DDP steps per round")
    ap.add_argument("--out", nargs="?", const="", metavar="DIR")
    args = ap.parse_args()
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    before = os.environ.get("TORCH_MPIGPU_DESYNC_CHECK")
    groups = {mode: group_with(mode) for mode in MODES}
    if before is None:  # the run's own settings, as the manifest records them
        os.environ.pop("TORCH_MPIGPU_DESYNC_CHECK")
    else:
        os.environ["TORCH_MPIGPU_DESYNC_CHECK"] = before
    first = int(os.environ.get("TORCH_MPIGPU_DESYNC_CHECK_FIRST_OPS", "64"))
    for g in groups.values():  # past the young phase
        for _ in range(first + 1):
            dist.all_reduce(torch.ones(1), group=g)
    times = {(size, mode): [] for size in SIZES for mode in MODES}
    steps = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for size in SIZES:
            t = torch.ones(max(1, size // 4))
            for mode in MODES:
                times[(size, mode)].append(mean_op(groups[mode], t, args.ops if size < 1 << 20 else 8))
        for mode in MODES:
            steps[mode].append(ddp_step_time(groups[mode], args.steps))
    rows = []
    for what, per_mode in [(f"all_reduce {size} B", {m: times[(size, m)] for m in MODES})
                           for size in SIZES] + [("DDP step (MLP 784-256-10, batch 64)", steps)]:
        med = {m: statistics.median(v) * 1e6 for m, v in per_mode.items()}
        rows.append({"what": what, **{f"{m}_us": med[m] for m in MODES},
                     "auto_over_off": med["auto"] / med["0"], "every_over_off": med["1"] / med["0"]})
    if rank == 0:
        lines = [f"desync check cost, {world} ranks, mean per op (median of {args.rounds} rounds, "
                 "slowest rank)",
                 f"{'':40} {'off us':>10} {'auto us':>10} {'every us':>10} {'auto/off':>9} "
                 f"{'every/off':>9}"]
        for r in rows:
            lines.append(f"{r['what']:40} {r['0_us']:>10.2f} {r['auto_us']:>10.2f} "
                         f"{r['1_us']:>10.2f} {r['auto_over_off']:>9.3f} {r['every_over_off']:>9.3f}")
        print("\n".join(lines))
        if args.out is not None:
            folder, prefix = run_paths(args.out, f"desync-cost-{world}ranks", "desync_cost")
            Path(f"{prefix}.txt").write_text("\n".join(lines) + "\n")
            Path(f"{prefix}.json").write_text(json.dumps(rows, indent=2) + "\n")
            if folder is not None:
                write_manifest(folder, "the desync check's cost: all_reduce 8 B / 64 KiB / 16 MiB "
                               "and a DDP step with TORCH_MPIGPU_DESYNC_CHECK=0, auto, 1",
                               ranks=world)
            print(f"wrote {prefix}.txt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
