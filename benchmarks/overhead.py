"""Where the time of a small blocking all_reduce goes: timers around each layer, same buffer.

    mpirun -np 2 python benchmarks/overhead.py [--bytes 8] [--iters 2000] [--json out.json]
    mpirun -np 2 python benchmarks/overhead.py --tensors 1000 --bytes 1024   # a coalesced call
    mpirun -np 2 python benchmarks/overhead.py --out     # JSON in a new run folder in benchmarks/results

With --tensors N the layers are those of one all_reduce_coalesced of N tensors of --bytes each
(raw MPI: one Allreduce of all the bytes, the floor fusion can approach), plus the same call on
N views of one flat buffer (what DDP buckets and FSDP flat parameters are: no packing needed).

  raw MPI         mpi4py Allreduce (in place): the floor
  mpigpu backend  ProcessGroupMPIGPU::allreduce + wait, called directly (our code + MPI)
  c10d dispatch   ProcessGroup.allreduce + wait (torch's op dispatcher in front of ours)
  dist.all_reduce the Python API users call (torch's Python wrapper in front of that)
  gloo            dist.all_reduce on a gloo group, for scale

Each layer's cost is the difference to the one below it. Medians over --iters calls, slowest rank.
"""

import argparse
import json
import warnings

import torch
import torch.distributed as dist

import torch_mpi_gpu  # noqa: F401
from torch_mpi_gpu.bench import timed as bench_timed

# all_reduce_coalesced is the call measured (many tensors fused); torch 2.13 announces its
# deprecation with no public replacement yet, so that one FutureWarning is silenced here
warnings.filterwarnings("ignore", message=r".*all_reduce_coalesced.* will be deprecated")


def timed(fn, iters):
    """Median microseconds of the slowest rank, after 50 warm-up calls (the benchmark's timer)."""
    return bench_timed(fn, iters, 50, lambda: None, STATS)[0] * 1e6


def main():
    global STATS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--tensors", type=int, default=1, help="N > 1: a coalesced call of N tensors")
    ap.add_argument("--json")
    ap.add_argument("--out", nargs="?", const="", metavar="DIR",
                    help="write the JSON and MANIFEST.json into DIR; without DIR into a new run folder, "
                         "benchmarks/results/<date>_<machine>_overhead-<n>ranks/")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("mpigpu")
    STATS = dist.new_group(backend="gloo")
    gloo = STATS
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    pg = dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    if args.tensors > 1:
        rows = coalesced_rows(args, comm, MPI, pg, backend, gloo)
        what = f"{args.tensors} x {args.bytes} bytes fp32 all_reduce_coalesced"
    else:
        rows = single_rows(args, comm, MPI, pg, backend, gloo)
        what = f"{args.bytes} bytes fp32 all_reduce"
    report(args, rows, what)
    dist.destroy_process_group()


def single_rows(args, comm, MPI, pg, backend, gloo):
    t = torch.ones(max(1, args.bytes // 4))
    arr = t.numpy()
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # what dist.all_reduce(async_op=False) passes
    return {
        "raw MPI (mpi4py)": timed(lambda: comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM), args.iters),
        "mpigpu backend": timed(lambda: backend.allreduce([t], opts).wait(), args.iters),
        "c10d dispatch": timed(lambda: pg.allreduce([t], opts).wait(), args.iters),
        "dist.all_reduce": timed(lambda: dist.all_reduce(t), args.iters),
        "gloo dist.all_reduce": timed(lambda: dist.all_reduce(t, group=gloo), args.iters),
    }


def coalesced_rows(args, comm, MPI, pg, backend, gloo):
    count = max(1, args.bytes // 4)
    ts = [torch.zeros(count) for _ in range(args.tensors)]
    flat = torch.zeros(count * args.tensors)
    views = list(flat.split(count))
    arr = flat.numpy()
    opts = dist.AllreduceCoalescedOptions()
    return {
        "raw MPI, all bytes at once": timed(lambda: comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM), args.iters),
        "mpigpu backend": timed(lambda: backend.allreduce_coalesced(ts, opts).wait(), args.iters),
        "c10d dispatch": timed(lambda: pg.allreduce_coalesced(ts, opts).wait(), args.iters),
        "dist.all_reduce_coalesced": timed(lambda: dist.all_reduce_coalesced(ts), args.iters),
        "gloo dist.all_reduce_coalesced": timed(lambda: dist.all_reduce_coalesced(ts, group=gloo), args.iters),
        "views: mpigpu backend": timed(lambda: backend.allreduce_coalesced(views, opts).wait(), args.iters),
        "views: dist.all_reduce_coalesced": timed(lambda: dist.all_reduce_coalesced(views), args.iters),
    }


def report(args, rows, what):
    if dist.get_rank() == 0:
        print(f"# {what}, {dist.get_world_size()} ranks, median of "
              f"{args.iters} calls (slowest rank), torch {torch.__version__}")
        below = None
        for name, us in rows.items():
            layered = not name.startswith(("gloo", "views"))
            extra = f"  (+{us - below:.1f} us)" if layered and below is not None else ""
            print(f"{name:<34} {us:8.2f} us{extra}")
            if layered:
                below = us
        if args.out is not None:  # a run folder: the JSON and what made it
            from torch_mpi_gpu.manifest import run_paths, write_manifest
            world = dist.get_world_size()
            stem = f"overhead_{args.tensors}x{args.bytes}B" if args.tensors > 1 else f"overhead_{args.bytes}B"
            folder, prefix = run_paths(args.out, f"overhead-{world}ranks", stem, prefix=False)
            write_manifest(folder, f"overhead.py: where the time of {what} goes, layer by layer", world,
                           in_job=True)
            args.json = args.json or f"{prefix}.json"
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bytes": args.bytes, "tensors": args.tensors, "median_us": rows}, f,
                          indent=1)


if __name__ == "__main__":
    main()
