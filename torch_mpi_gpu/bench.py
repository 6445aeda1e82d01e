"""Collectives benchmark: mpigpu side by side with gloo, nccl and raw MPI (mpi4py) in one job.

    mpirun -np 2 python -m torch_mpi_gpu.bench -b 8 -e 64M -f 4 --ops allreduce,allgather \\
        --backends mpigpu,gloo,mpi --device cpu --json out.json --plot out.png

Conventions follow nccl-tests: the size is the whole buffer in bytes (for all_gather the output,
for reduce_scatter the input, for all_to_all what each rank sends); time is the median (and p95)
over iterations of the slowest rank; algbw = size / time; busbw = algbw x the op's factor
(all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, sendrecv 1).
Every point is first checked against the expected result (inputs are small integers, so sums
are exact in every dtype); any wrong element makes the exit status 1. A backend that cannot run
here (nccl without a GPU, nccl refusing two ranks on one GPU, raw MPI on CUDA buffers with an MPI
that is not CUDA-aware, gloo on CUDA tensors) is reported as such; `gloo-host` is gloo on host
tensors of the same size, for a CPU-side reference in a --device cuda run. `mpi` is MPI called through mpi4py on the same
buffers: the floor a backend over MPI can approach.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

from .manifest import cpu_model

OPS = ["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "sendrecv"]
BACKENDS = ["mpigpu", "gloo", "gloo-host", "nccl", "mpi", "torch"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def bus_factor(op, n):
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def machine_header(device, world):
    head = {"host": platform.node(), "cpu": f"{cpu_model()}, {os.cpu_count()} cores",
            "torch": torch.__version__, "ranks": world, "device": device}
    if device == "cuda":
        head["gpu"] = torch.cuda.get_device_name()
        head["gpu_shared_by_ranks"] = world  # on the lent machines every rank uses one GPU
        try:
            head["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            head["nccl"] = "unavailable"
    try:
        import torch_mpi_gpu
        info = torch_mpi_gpu.info(all_tiers=True)
        head["mpi"] = info["mpi_library"]
        head["cuda_aware_mpi"] = info["cuda_aware"]
        head["mpigpu_cuda_path"] = info["paths"]["cuda tensors"].split(":")[0]
        head["mpigpu_cuda_reduce_path"] = info["paths"]["cuda reductions"].split(":")[0]
        head["mpigpu_settings"] = {k: v for tier in info["settings"].values()
                                   for k, v in tier.items() if "(default)" not in str(v)}
    except Exception as e:  # noqa: BLE001
        head["mpi"] = f"unavailable ({e})"
    return head


class Case:
    """Buffers, the call and the expected result for one (op, size, dtype) on this rank."""

    def __init__(self, op, nbytes, dtype, device, rank, world, inplace, red):
        self.op, self.rank, self.world, self.red = op, rank, world, red
        es = torch.tensor([], dtype=dtype).element_size()
        per = max(1, nbytes // es // world) if op in ("allgather", "reduce_scatter", "alltoall") \
            else max(1, nbytes // es)
        self.count = per * world if op in ("allgather", "reduce_scatter", "alltoall") else per
        self.nbytes = self.count * es
        pattern = torch.arange(self.count, device=device) % 7
        mine = (pattern + rank + 1).to(dtype)
        if op == "allreduce":
            self.inp = mine
            self.out = mine if inplace else torch.empty_like(mine)
            self.expected = self._reduce([(pattern + r + 1) for r in range(world)]).to(dtype)
        elif op == "allgather":
            self.inp = mine[:per].clone()
            self.out = torch.empty(self.count, dtype=dtype, device=device)
            if inplace:
                self.inp = self.out[rank * per:(rank + 1) * per]
                self.inp.copy_(mine[:per])
            self.expected = torch.cat([(pattern[:per] + r + 1) for r in range(world)]).to(dtype)
        elif op == "reduce_scatter":
            self.inp = mine
            self.out = torch.empty(per, dtype=dtype, device=device)
            full = self._reduce([(pattern + r + 1) for r in range(world)])
            self.expected = full[rank * per:(rank + 1) * per].to(dtype)
        elif op == "broadcast":
            self.inp = self.out = mine if rank == 0 else torch.zeros_like(mine)
            self.expected = (pattern + 1).to(dtype)
        elif op == "alltoall":
            # block j of rank r's input goes to rank j: value (r + 1) * 10 + j + pattern
            blocks = [(pattern[:per] + (rank + 1) * 10 + j) for j in range(world)]
            self.inp = torch.cat(blocks).to(dtype)
            self.out = torch.empty(self.count, dtype=dtype, device=device)
            self.expected = torch.cat([(pattern[:per] + (r + 1) * 10 + rank)
                                       for r in range(world)]).to(dtype)
        elif op == "sendrecv":  # a ring: send to rank+1, receive from rank-1
            self.inp = mine
            self.out = torch.empty_like(mine)
            self.expected = (pattern + (rank - 1) % world + 1).to(dtype)
        self.initial = self.inp.clone()

    def _reduce(self, parts):
        stack = torch.stack([p.to(torch.float64) for p in parts])
        return {"sum": stack.sum(0), "max": stack.max(0).values, "min": stack.min(0).values}[self.red]

    def reset(self):
        self.inp.copy_(self.initial)

    def wrong(self):
        return int((self.out.to(torch.float64) != self.expected.to(torch.float64)).sum())


# torch 2.13's names (the old ones warn there); torch before 2.13 has only the old ones
ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER_SINGLE = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def torch_call(case, group, red_op):
    op, rank, world = case.op, case.rank, case.world
    if op == "allreduce":
        if case.out is not case.inp:
            case.out.copy_(case.inp)
        return lambda: dist.all_reduce(case.out, op=red_op, group=group)
    if op == "allgather":
        return lambda: ALL_GATHER_SINGLE(case.out, case.inp, group=group)
    if op == "reduce_scatter":
        return lambda: REDUCE_SCATTER_SINGLE(case.out, case.inp, op=red_op, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(case.out, src=dist.get_global_rank(group, 0) if group else 0,
                                      group=group)
    if op == "alltoall":
        return lambda: dist.all_to_all_single(case.out, case.inp, group=group)
    if op == "sendrecv":
        def ring():
            if world == 1:
                case.out.copy_(case.inp)
                return
            g = lambda r: dist.get_global_rank(group, r) if group else r  # noqa: E731
            ops = [dist.P2POp(dist.isend, case.inp, g((rank + 1) % world), group),
                   dist.P2POp(dist.irecv, case.out, g((rank - 1) % world), group)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return ring
    raise ValueError(op)


def mpi_call(case, comm, red):
    from mpi4py import MPI
    if case.inp.is_cuda:
        buf = lambda t: t  # noqa: E731  (mpi4py takes __cuda_array_interface__)
    else:
        buf = lambda t: t.numpy() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy()  # noqa: E731
    if case.inp.dtype in (torch.float16, torch.bfloat16) and case.op in ("allreduce", "reduce_scatter"):
        raise RuntimeError("mpi4py has no 16-bit float reduction")
    mop = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[red]
    op, rank, world = case.op, case.rank, case.world
    # the buffers wrapped once, outside the timed call: raw MPI's time is MPI's alone
    inp, out = buf(case.inp), buf(case.out)
    if op == "allreduce":
        if case.out is not case.inp:
            return lambda: comm.Allreduce(inp, out, op=mop)
        return lambda: comm.Allreduce(MPI.IN_PLACE, out, op=mop)
    if op == "allgather":
        return lambda: comm.Allgather(inp, out)
    if op == "reduce_scatter":
        return lambda: comm.Reduce_scatter_block(inp, out, op=mop)
    if op == "broadcast":
        return lambda: comm.Bcast(out, root=0)
    if op == "alltoall":
        return lambda: comm.Alltoall(inp, out)
    if op == "sendrecv":
        return lambda: comm.Sendrecv(inp, dest=(rank + 1) % world, recvbuf=out,
                                     source=(rank - 1) % world)
    raise ValueError(op)


def timed(fn, iters, warmup, sync, stats_group):
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=stats_group)  # the slowest rank per iteration
    s = sorted(t.tolist())
    return statistics.median(s), s[min(len(s) - 1, int(0.95 * len(s)))]


def mpigpu_variant(name):
    """`mpigpu[ALGO=ring;CUDA_REDUCE=staged]` -> {"TORCH_MPIGPU_ALGO": "ring", ...}: an mpigpu
    group created with these settings (read at group creation), so one run compares algorithms
    and paths side by side."""
    if not name.startswith("mpigpu[") or not name.endswith("]"):
        return None
    settings = {}
    for item in filter(None, name[len("mpigpu["):-1].split(";")):
        key, _, value = item.partition("=")
        settings["TORCH_MPIGPU_" + key.strip()] = value.strip()
    return settings


def open_backends(names, device, rank):
    """{name: (group or comm) or an error string saying why it cannot run here}."""
    out = {}
    for name in names:
        try:
            variant = mpigpu_variant(name)
            if variant is not None:
                if not _under_mpi():
                    raise RuntimeError("mpigpu needs an MPI launcher (mpirun/srun), not torchrun")
                saved = {k: os.environ.get(k) for k in variant}
                os.environ.update(variant)
                try:
                    out[name] = dist.new_group(backend="mpigpu")
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                continue
            if name == "mpi":
                if not _under_mpi():
                    raise RuntimeError("not started by an MPI launcher")
                from mpi4py import MPI
                if device == "cuda":
                    import torch_mpi_gpu
                    if not torch_mpi_gpu._C.cuda_path()[0] == "cuda-direct":
                        raise RuntimeError("the MPI is not CUDA-aware: raw MPI cannot take device buffers")
                out[name] = MPI.COMM_WORLD
            elif name == "nccl":
                if device != "cuda":
                    raise RuntimeError("nccl needs --device cuda")
                if not dist.is_nccl_available():
                    raise RuntimeError("this torch has no NCCL")
                _check_nccl_can_share_gpu()
                out[name] = dist.new_group(backend="nccl")
            elif name == "mpigpu":
                if not _under_mpi():
                    raise RuntimeError("mpigpu needs an MPI launcher (mpirun/srun), not torchrun")
                out[name] = dist.new_group(backend="mpigpu")
            elif name == "gloo":
                if device == "cuda":
                    # gloo's TCP pair thread throws on a device pointer and the process aborts
                    # (nothing to catch): seen with torch 2.11 on an H100, 2 ranks on one GPU
                    raise RuntimeError("gloo aborts the whole job on CUDA tensors (gloo::IoException "
                                       "'writev: Bad address'); gloo-host times gloo on host copies")
                out[name] = dist.new_group(backend="gloo")
            elif name == "gloo-host":
                out[name] = dist.new_group(backend="gloo")
            elif name == "torch":  # the floor: torch's side of a call, nothing sent
                import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
                out[name] = dist.new_group(backend="fake")
            else:
                raise ValueError(f"unknown backend {name}; choose from {BACKENDS} or "
                                 "mpigpu[SETTING=value;...]")
        except Exception as e:  # noqa: BLE001
            out[name] = f"cannot run: {e}"
    return out


def _check_nccl_can_share_gpu():
    """NCCL before 2.30 refuses two ranks on one GPU ("Duplicate GPU detected") at its first
    collective; say so up front instead of failing every point."""
    from torch_mpi_gpu.launcher import detect_launcher
    found = detect_launcher() or {}
    local = int(found.get("local_size") or 1)
    if local <= torch.cuda.device_count():
        return
    version = torch.cuda.nccl.version()
    if version < (2, 30):
        raise RuntimeError(f"{local} ranks share {torch.cuda.device_count()} GPU(s) and NCCL "
                           f"{'.'.join(map(str, version))} refuses that (allowed from NCCL 2.30)")
    if os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") != "1":
        raise RuntimeError(f"{local} ranks share a GPU: set NCCL_MULTI_RANK_GPU_ENABLE=1 "
                           "(mpirun -x) to let NCCL run them")


def _under_mpi():
    from torch_mpi_gpu.launcher import detect_launcher
    return detect_launcher() is not None


def progress(total, enabled):
    if not enabled:
        return None
    try:
        from rich.progress import Progress
    except ImportError:
        return None
    p = Progress(transient=True)
    p.start()
    return p, p.add_task("benchmark", total=total)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-b", "--begin", default="8", help="smallest size in bytes (K/M/G suffixes)")
    ap.add_argument("-e", "--end", default="64M", help="largest size in bytes")
    ap.add_argument("-f", "--factor", type=int, default=4, help="size multiplier between points")
    ap.add_argument("--sizes", help="these sizes instead of -b/-e/-f, comma-separated (8,4K,64K,1M)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--backends", default="mpigpu,gloo,nccl,mpi,torch",
                    help="comma-separated; mpigpu[ALGO=ring;CUDA_REDUCE=staged] is an mpigpu group "
                         "with those TORCH_MPIGPU_* settings")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32")
    ap.add_argument("--op", choices=list(REDUCE_OPS), default="sum", help="reduce op")
    ap.add_argument("--mode", choices=["outofplace", "inplace"], default="outofplace",
                    help="allreduce/allgather: separate output buffer, or in place")
    ap.add_argument("-n", "--iters", type=int, default=30)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--json", help="write every point and the header here (rank 0)")
    ap.add_argument("--plot", help="write busbw and latency against size per backend (PNG)")
    ap.add_argument("--out", nargs="?", const="", metavar="DIR",
                    help="write the JSON, the plot and MANIFEST.json into DIR; without DIR into a new "
                         "run folder, benchmarks/results/<date>_<machine>_<ops>-<n>ranks/")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--external", action="append", default=[],
                    help="JSON rows measured by another program with the same conventions "
                         "(benchmarks/nccl_bench.cu): shown in the table and the plot beside ours")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    import torch_mpi_gpu  # noqa: F401  (registers mpigpu)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA device visible")
        torch_mpi_gpu.select_cuda_device()
    # The default group only carries the timing statistics: gloo works everywhere.
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stats = dist.group.WORLD
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    dtype, red = DTYPES[args.dtype], args.op
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            sys.exit(f"unknown op {o}; choose from {OPS}")
    backends = open_backends([b.strip() for b in args.backends.split(",") if b.strip()],
                             args.device, rank)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    head = machine_header(args.device, world)
    head.update({"dtype": args.dtype, "reduce_op": red, "mode": args.mode,
                 "iters": args.iters, "warmup": args.warmup, "threads_per_rank": args.threads})
    sizes = []
    s = parse_size(args.begin)
    while s <= parse_size(args.end):
        sizes.append(s)
        s *= args.factor
    if args.sizes:
        sizes = [parse_size(x.strip()) for x in args.sizes.split(",") if x.strip()]
    if rank == 0:
        print("# " + " | ".join(f"{k}: {v}" for k, v in head.items()), flush=True)
        for name, b in backends.items():
            if isinstance(b, str):
                print(f"# {name}: {b}", flush=True)
    live = [n for n, b in backends.items() if not isinstance(b, str)]
    bar = progress(len(ops) * len(sizes) * len(live), rank == 0 and not args.no_progress)
    rows, wrong_total = [], 0
    for op in ops:
        for size in sizes:
            for name in live:
                where = torch.device("cpu") if name == "gloo-host" else device
                case = Case(op, size, dtype, where, rank, world, args.mode == "inplace", red)
                # raw MPI does not order itself after the kernels that filled the case's device
                # buffers (mpigpu does, against the current stream): wait for them here
                sync()
                row = {"op": op, "bytes": case.nbytes, "backend": name}
                try:
                    if name == "mpi":
                        fn = mpi_call(case, backends[name], red)
                    else:
                        fn = torch_call(case, backends[name], REDUCE_OPS[red])
                    fn()
                    sync()
                    row["wrong"] = 0 if name == "torch" else case.wrong()  # the fake moves nothing
                    case.reset()
                    sync()
                    iters = args.iters if case.nbytes < (16 << 20) else max(3, args.iters // 5)
                    waits = node_waits()
                    med, p95 = timed(fn, iters, args.warmup, sync, stats)
                    # how often each op waited for its node's peers (the node algorithm): with
                    # device slots ordered from the host, each wait is a cross-process hand-off
                    row["node_waits_per_op"] = {k: (v - waits[k]) / (iters + args.warmup)
                                                for k, v in node_waits().items()}
                    algbw = case.nbytes / med / 1e9
                    row.update({"median_us": med * 1e6, "p95_us": p95 * 1e6, "algbw_GBps": algbw,
                                "busbw_GBps": algbw * bus_factor(op, world)})
                except Exception as e:  # noqa: BLE001
                    row.update({"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
                # every rank must agree on wrong counts and failures
                flag = torch.tensor([row.get("wrong", 0), "error" in row], dtype=torch.int64)
                dist.all_reduce(flag, group=stats)
                row["wrong"], failed = int(flag[0]), bool(flag[1])
                row["wait_us_per_op_by_rank"] = waits_by_rank(row, world, stats)
                if failed and "error" not in row:
                    row["error"] = "failed on another rank"
                wrong_total += row["wrong"]
                rows.append(row)
                if rank == 0 and args.no_progress:  # each point as it lands: a run cut short keeps them
                    print(f"# point {op} {row['bytes']} {name}: " + (row["error"] if "error" in row else
                          f"{row['median_us']:.1f} us, busbw {row['busbw_GBps']:.3f} GB/s, wrong {row['wrong']}"
                          f", node waits/op {waits_text(row)}, waits us/op by rank (start/settle/"
                          f"barrier) {wait_times_text(row)}"), flush=True)
                if bar:
                    bar[0].advance(bar[1])
    if bar:
        bar[0].stop()
    for path in args.external:  # rows of the sizes and ops of this run, under their own name
        with open(path) as f:
            ext = json.load(f)
        for r in ext["rows"]:
            if r["op"] in ops and any(row["op"] == r["op"] and row["bytes"] == r["bytes"] for row in rows):
                rows.append(r)
                if r["backend"] not in live:
                    live.append(r["backend"])
        head.setdefault("external", []).append({k: v for k, v in ext.items() if k != "rows"} | {"file": path})
    if rank == 0:
        print_table(rows, ops, sizes, live)
        if wrong_total:
            print(f"# WRONG RESULTS: {wrong_total} elements", flush=True)
        if args.out is not None:  # a run folder: the files and what made them
            args.json, args.plot = save_run(args, ops, world, head)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"header": head, "unavailable": {n: b for n, b in backends.items()
                                                           if isinstance(b, str)},
                           "rows": rows}, f, indent=1, default=str)
        if args.plot:
            plot(rows, ops, live, head, args.plot)
    dist.barrier(group=stats)
    dist.destroy_process_group()
    return 1 if wrong_total else 0


def save_run(args, ops, world, head):
    """--out: the run folder's JSON and plot paths (--json/--plot where given), its manifest written."""
    from .manifest import run_paths, write_manifest
    name = "collectives" if set(ops) == set(OPS) else "-".join(ops)
    folder, prefix = run_paths(args.out, f"{name}-{world}ranks", f"{name}_{args.device}_{world}ranks",
                               args.device, prefix=False)
    gpu = head.get("gpu")
    write_manifest(folder, f"torch_mpi_gpu.bench: {', '.join(ops)}, {args.dtype}, {args.begin} - {args.end} "
                   f"bytes, backends {args.backends}", world,
                   devices=f"{world} ranks sharing one {gpu}" if gpu else "cpu",
                   mpi=str(head.get("mpi", "")).split(",")[0] or None, in_job=True, device=args.device)
    import importlib.util
    plot = args.plot or (f"{prefix}.png" if importlib.util.find_spec("matplotlib") else None)
    return args.json or f"{prefix}.json", plot


def node_waits():
    from . import _C
    return _C.node_waits()


WAIT_TIMES = ("start_wait_us", "settle_us", "barrier_us")


def waits_by_rank(row, world, stats):
    """Where each rank's op time went, per op: waiting at the op's start for the caller's queued
    device work, for its own device work before a node barrier or MPI, and at node barriers for its
    peers (one collective: every rank calls it, also after a failure)."""
    w = row.get("node_waits_per_op") or {}
    mine = torch.tensor([float(w.get(k, 0.0)) for k in WAIT_TIMES], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=stats)
    return {k: [round(e[i].item(), 1) for e in every] for i, k in enumerate(WAIT_TIMES)}


def wait_times_text(row):
    """'0: 12/0/300, 1: 150/140/3': per rank, start / settle / barrier microseconds per op."""
    t = row.get("wait_us_per_op_by_rank")
    if not t or not any(any(v) for v in t.values()):
        return "-"
    ranks = len(t[WAIT_TIMES[0]])
    return ", ".join(f"{r}: " + "/".join(f"{t[k][r]:.0f}" for k in WAIT_TIMES) for r in range(ranks))


def waits_text(row):
    """Node-algorithm waits per op: "2h" (host barriers), "2d" (device barriers), "-" (none);
    then " 2e": stream events a device path queued to order the op (each a device command: on a
    GPU the ranks share, one queued during a peer's work costs a switch). This rank's counts (rank
    0: the node's leader)."""
    w = row.get("node_waits_per_op") or {}
    parts = [f"{w[k]:.3g}{k[0]}" for k in ("host", "device") if w.get(k)]
    more = [f"{w[k]:.3g}{tag}" for k, tag in (("stream_events", "e"),) if w.get(k)]
    return " ".join(["+".join(parts) or "-"] + more)


def lookup(rows, op, size_bytes, backend):
    for r in rows:
        if r["op"] == op and r["backend"] == backend and r["bytes"] == size_bytes:
            return r
    return None


def median_of(r):
    return r["median_us"] if r and "median_us" in r else float("nan")


def print_table(rows, ops, sizes, live):
    ref = "mpi" if "mpi" in live else None
    for op in ops:
        print(f"\n## {op}")
        width = max(9, *(len(n) for n in live))
        print(f"{'bytes':>10} {'backend':>{width}} {'median us':>11} {'p95 us':>10} {'algbw GB/s':>11} "
              f"{'busbw GB/s':>11} {'wrong':>6} {'vs mpi':>7} {'vs mpigpu':>9} {'vs nccl':>7} "
              f"{'own us':>7} {'own/mpi':>7} {'waits/op':>8}")
        for size_bytes in sorted({r["bytes"] for r in rows if r["op"] == op}):
            base = median_of(lookup(rows, op, size_bytes, ref)) if ref else float("nan")
            ours = median_of(lookup(rows, op, size_bytes, "mpigpu"))
            nccl = median_of(lookup(rows, op, size_bytes, "nccl"))
            floor = median_of(lookup(rows, op, size_bytes, "torch"))
            for name in live:
                r = lookup(rows, op, size_bytes, name)
                if r is None:
                    continue
                if "error" in r:
                    print(f"{size_bytes:>10} {name:>{width}} {r['error']}")
                    continue
                t = r["median_us"]
                # own: the backend's part of the call (torch's floor taken off); raw MPI has none
                own = float("nan") if name in ("mpi", "torch") else t - floor
                r["own_us"] = None if own != own else own
                print(f"{size_bytes:>10} {name:>{width}} {t:>11.1f} {r['p95_us']:>10.1f} "
                      f"{r['algbw_GBps']:>11.3f} {r['busbw_GBps']:>11.3f} {r['wrong']:>6} "
                      f"{t / base:>7.2f} {t / ours:>9.2f} {t / nccl:>7.2f} "
                      f"{own:>7.1f} {own / base:>7.2f} {waits_text(r):>8}")
    sys.stdout.flush()


def plot(rows, ops, live, head, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(ops), figsize=(4.2 * len(ops), 7), squeeze=False)
    for j, op in enumerate(ops):
        for name in live:
            pts = sorted((r["bytes"], r["busbw_GBps"], r["median_us"]) for r in rows
                         if r["op"] == op and r["backend"] == name and "median_us" in r)
            if not pts:
                continue
            x = [p[0] for p in pts]
            axes[0][j].plot(x, [p[1] for p in pts], marker="o", ms=3, label=name)
            axes[1][j].plot(x, [p[2] for p in pts], marker="o", ms=3, label=name)
        axes[0][j].set_title(op)
        for i, ylabel in ((0, "busbw GB/s"), (1, "median latency us")):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_yscale("log")
            axes[i][j].set_xlabel("bytes")
            axes[i][j].set_ylabel(ylabel)
            axes[i][j].grid(True, which="both", alpha=0.3)
        axes[0][j].legend(fontsize=8)
    where = head.get("gpu", head.get("cpu", ""))
    fig.suptitle(f"{head['ranks']} ranks, {head['device']} ({where}), {head.get('dtype')}, "
                 f"torch {head['torch']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
