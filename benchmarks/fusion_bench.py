"""Fusion benchmark: N separate all_reduces vs one coalesced call vs one all_reduce of the same
total bytes, for N in {10, 100, 1000} and tensor sizes 256 B - 1 MiB (fp32, SUM).

    mpirun -np 2 python benchmarks/fusion_bench.py [--json out.json] [--n 10,100,1000]
    mpirun -np 2 python benchmarks/fusion_bench.py --out     # a new run folder in benchmarks/results

Times are medians over iterations of the slowest rank. "calls" is the number of MPI calls the
coalesced call made (TORCH_MPIGPU_FUSION_BYTES caps a bucket, default 64 MiB). Every variant is
first checked against the expected sum; any wrong element exits 1.
"""

import argparse
import json
import platform
import sys
import warnings

import torch
import torch.distributed as dist

import torch_mpi_gpu
from torch_mpi_gpu.bench import timed as bench_timed

# all_reduce_coalesced is the call measured (many tensors fused); torch 2.13 announces its
# deprecation with no public replacement yet, so that one FutureWarning is silenced here
warnings.filterwarnings("ignore", message=r".*all_reduce_coalesced.* will be deprecated")


def timed(fn, iters):
    """Median seconds of the slowest rank, after one warm-up call (the benchmark's timer)."""
    return bench_timed(fn, iters, 1, lambda: None, None)[0]


def time_variants(ts, big, iters):
    """Seconds per op of: one all_reduce per tensor, one coalesced call, one all_reduce of a
    tensor as big as all of them; and the MPI calls the coalesced call made."""
    def separate():
        for t in ts:
            dist.all_reduce(t)

    before = torch_mpi_gpu._C.mpi_call_count()
    dist.all_reduce_coalesced(ts)
    calls = torch_mpi_gpu._C.mpi_call_count() - before
    sep = timed(separate, iters)
    coal = timed(lambda: dist.all_reduce_coalesced(ts), iters)
    one = timed(lambda: dist.all_reduce(big), iters)
    return sep, coal, one, calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="10,100,1000")
    ap.add_argument("--sizes", default="256,4096,65536,1048576")
    ap.add_argument("--json")
    ap.add_argument("--out", nargs="?", const="", metavar="DIR",
                    help="write the JSON and MANIFEST.json into DIR; without DIR into a new run folder, "
                         "benchmarks/results/<date>_<machine>_fusion-<n>ranks/")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    info = torch_mpi_gpu.info(all_tiers=True)
    settings = {k: v for tier in info["settings"].values() for k, v in tier.items()}
    header = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}",
              "mpi": info["mpi_library"], "torch": info["torch"], "ranks": world,
              "fusion_bytes": settings.get("TORCH_MPIGPU_FUSION_BYTES", "unknown")}
    if rank == 0:
        print("# " + " | ".join(f"{k}: {v}" for k, v in header.items()))
        print(f"{'N':>5} {'bytes each':>10} {'total':>10} {'separate ms':>12} {'coalesced ms':>13} "
              f"{'one big ms':>11} {'calls':>6} {'coal/big':>9} {'sep/coal':>9}")
    rows, wrong = [], 0
    expected = world * (world + 1) / 2
    for n in [int(x) for x in args.n.split(",")]:
        for size in [int(x) for x in args.sizes.split(",")]:
            count = size // 4
            total = n * size
            ts = [torch.full((count,), float(rank + 1)) for _ in range(n)]
            big = torch.full((n * count,), float(rank + 1))
            # correctness of each variant, then timing on zeros (sums stay finite)
            dist.all_reduce_coalesced(ts)
            wrong += sum(int((t != expected).sum()) for t in ts)
            for t in ts:
                t.fill_(float(rank + 1))
            for t in ts:
                dist.all_reduce(t)
            wrong += sum(int((t != expected).sum()) for t in ts)
            dist.all_reduce(big)
            wrong += int((big != expected).sum())
            for t in ts:
                t.zero_()
            big.zero_()
            iters = 20 if total <= 4 << 20 else 5 if total <= 64 << 20 else 3
            sep, coal, one, calls = time_variants(ts, big, iters)
            row = {"n": n, "bytes_each": size, "total_bytes": total, "separate_ms": sep * 1e3,
                   "coalesced_ms": coal * 1e3, "one_big_ms": one * 1e3, "mpi_calls": calls,
                   "coalesced_vs_big": coal / one, "separate_vs_coalesced": sep / coal}
            rows.append(row)
            if rank == 0:
                print(f"{n:>5} {size:>10} {total:>10} {sep * 1e3:>12.3f} {coal * 1e3:>13.3f} "
                      f"{one * 1e3:>11.3f} {calls:>6} {coal / one:>9.2f} {sep / coal:>9.1f}",
                      flush=True)
            del ts, big
    if rank == 0:
        print(f"# wrong elements: {wrong}")
        if args.out is not None:  # a run folder: the JSON and what made it
            from torch_mpi_gpu.manifest import run_paths, write_manifest
            folder, prefix = run_paths(args.out, f"fusion-{world}ranks", f"fusion_cpu_{world}ranks",
                                       prefix=False)
            write_manifest(folder, "fusion_bench: N separate all_reduces against one all_reduce_coalesced "
                           f"against one all_reduce of the bytes, N {args.n}, bytes {args.sizes}", world,
                           mpi=header["mpi"].split(",")[0], in_job=True)
            args.json = args.json or f"{prefix}.json"
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"header": header, "rows": rows, "wrong": wrong}, f, indent=1)
    dist.destroy_process_group()
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
