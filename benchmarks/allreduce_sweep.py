"""fp32 all_reduce sweep, side by side in one job: mpigpu, gloo and raw MPI (mpi4py, same buffers).

    mpirun -np 2 python benchmarks/allreduce_sweep.py [-b 8] [-e 64M] [-f 8] [--json out.json]

nccl-tests conventions: size in bytes, median and p95 time per call, algbw = bytes/time,
busbw = algbw * 2(n-1)/n, and a wrong-element count per point (exit 1 on any wrong result).
A first look for the foundation; the full CLI (more ops, devices, plots) is its own piece of work.
"""

import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

import torch_mpi_gpu


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    # every rank reports the slowest rank's time for each iteration
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    s = sorted(t.tolist())
    return statistics.median(s), s[min(len(s) - 1, int(0.95 * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", type=int, default=8)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)

    dist.init_process_group("mpigpu")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    from mpi4py import MPI  # MPI is already initialised (MPI_THREAD_MULTIPLE) by mpigpu
    comm = MPI.COMM_WORLD

    info = torch_mpi_gpu.info()
    header = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                         f"{torch.get_num_threads()} torch thread(s) per rank",
              "mpi": info["mpi_library"], "torch": info["torch"], "ranks": n,
              "cuda_aware": info["cuda_aware_mpi"]}
    if rank == 0:
        print("# " + " | ".join(f"{k}: {v}" for k, v in header.items()))
        print(f"{'bytes':>10} {'backend':>7} {'median us':>11} {'p95 us':>10} {'busbw GB/s':>11} "
              f"{'wrong':>6} {'vs mpi':>7}")
    rows, wrong_total = [], 0
    size = parse_size(args.b)
    while size <= parse_size(args.e):
        count = max(1, size // 4)
        iters = args.iters if size < (1 << 22) else max(5, args.iters // 10)
        base = torch.arange(count, dtype=torch.float32) % 7 + rank
        expected = (torch.arange(count, dtype=torch.float32) % 7) * n + n * (n - 1) / 2
        buf = base.clone()
        results = {}
        for name in ("mpi", "mpigpu", "gloo"):
            if name == "mpi":
                arr = buf.numpy()
                fn = lambda: comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM)  # noqa: E731
            else:
                group = gloo if name == "gloo" else None
                fn = lambda g=group: dist.all_reduce(buf, group=g)  # noqa: E731
            buf.copy_(base)
            fn()
            wrong = int((buf != expected).sum())
            med, p95 = timed(fn, iters, args.warmup)
            results[name] = med
            busbw = size / med * 2 * (n - 1) / n / 1e9 if n > 1 else 0.0
            row = {"bytes": count * 4, "backend": name, "median_us": med * 1e6, "p95_us": p95 * 1e6,
                   "busbw_GBps": busbw, "wrong": wrong,
                   "ratio_vs_mpi": med / results["mpi"]}
            rows.append(row)
            wrong_total += wrong
            if rank == 0:
                print(f"{row['bytes']:>10} {name:>7} {row['median_us']:>11.1f} {row['p95_us']:>10.1f} "
                      f"{busbw:>11.3f} {wrong:>6} {row['ratio_vs_mpi']:>7.2f}", flush=True)
        size *= args.f
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    sys.exit(1 if wrong_total else 0)


if __name__ == "__main__":
    main()
