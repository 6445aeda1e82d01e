"""How long `dist.init_process_group("mpigpu")` takes when the group meets over the MPI store
(the default under an MPI launcher) and over torch's TCPStore (TORCH_MPIGPU_MASTER_PORT set: an
address agreed through MPI, rank 0 listening), at each rank count, launched alternately
so the machine's noise falls on both alike.

    python benchmarks/store_init.py [--ranks 2 4 8 16] [--rounds 5] [--out [DIR]]

Each launch starts MPI first and meets in an MPI barrier, then times init_process_group on every
rank and keeps the slowest rank's (the group is ready when its last rank is). Also counts the
store requests the ranks made at init (the MPI store's server on rank 0 answers all of them), and
the rate at which rank 0's store answers when every rank adds to one counter 200 times at once. Prints one
table (median over rounds); --out writes it, its JSON and a MANIFEST.json into a run folder.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = "--child"
ADDS = 200


def child(store):
    import torch
    import torch.distributed as dist

    from torch_mpi_gpu import _C

    _C.mpi_info()  # MPI started, outside the timing (both stores need it)
    _C.allgather_bytes(b"", None)  # every rank starts the clock together
    start = time.perf_counter()
    dist.init_process_group("mpigpu")
    took = time.perf_counter() - start
    slowest = torch.tensor([took], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    calls = torch.tensor([float(_C.mpi_store_calls())], dtype=torch.float64)
    dist.all_reduce(calls)
    # the server's rate: every rank adds to one counter ADDS times at once
    kv = dist.distributed_c10d._get_default_store()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(ADDS):
        kv.add("bench/adds", 1)
    rate = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(rate, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"store": store, "ranks": dist.get_world_size(),
                                      "seconds": slowest.item(),
                                      "requests": int(calls.item()),
                                      "adds_per_second": ADDS * dist.get_world_size()
                                      / rate.item()}), flush=True)
    dist.destroy_process_group()


def launch(ranks, store):
    cmd = [sys.executable, "-m", "torch_mpi_gpu.mpirun", "-np", str(ranks), "-x",
           "OMP_NUM_THREADS=1"]
    if store == "tcp":
        with socket.socket() as s:  # a port free now, for rank 0's store
            s.bind(("", 0))
            cmd += ["-x", f"TORCH_MPIGPU_MASTER_PORT={s.getsockname()[1]}"]
    cmd += [__file__, CHILD, store]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASTER_")}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} gave no result (exit {out.returncode}):\n"
                       f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def table(results, ranks):
    lines = ["| ranks | init, MPI store (ms) | init, TCPStore (ms) | MPI / TCP | requests to "
             "rank 0 at init (MPI store) | per rank | adds/s served, MPI store | adds/s, "
             "TCPStore |", "|---|---|---|---|---|---|---|---|"]
    for n in ranks:
        mpi = [r for r in results if r["ranks"] == n and r["store"] == "mpi"]
        tcp = [r for r in results if r["ranks"] == n and r["store"] == "tcp"]
        m = statistics.median(r["seconds"] for r in mpi) * 1e3
        t = statistics.median(r["seconds"] for r in tcp) * 1e3
        req = statistics.median(r["requests"] for r in mpi)
        ma = statistics.median(r["adds_per_second"] for r in mpi)
        ta = statistics.median(r["adds_per_second"] for r in tcp)
        lines.append(f"| {n} | {m:.0f} | {t:.0f} | {m / t:.2f} | {req:.0f} | {req / n:.1f} "
                     f"| {ma:.0f} | {ta:.0f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", nargs="?", const="", default=None)
    args = ap.parse_args()
    results = []
    for n in args.ranks:
        for i in range(args.rounds):
            for store in (("mpi", "tcp") if i % 2 == 0 else ("tcp", "mpi")):
                results.append(launch(n, store))
                print(json.dumps(results[-1]), flush=True)
    text = table(results, args.ranks)
    print(text)
    if args.out is not None:
        from torch_mpi_gpu.manifest import new_run, write_manifest

        folder = Path(args.out) if args.out else new_run("store-init")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "store_init.txt").write_text(text + "\n")
        (folder / "store_init.json").write_text(json.dumps(results, indent=1) + "\n")
        write_manifest(folder, "init_process_group time, MPI store against TCPStore, at "
                       + ", ".join(map(str, args.ranks)) + " ranks (oversubscribed past 2)",
                       ranks=max(args.ranks),
                       command="python benchmarks/store_init.py " + " ".join(sys.argv[1:]),
                       rounds=args.rounds)
        print(f"written to {folder}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == CHILD:
        child(sys.argv[2])
    else:
        main()
