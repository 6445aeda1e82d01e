"""The performance scorecard: each target of the performance issue, what was measured, the
ratio, and met / not met, from the project's own benchmarks in one run.

    python benchmarks/targets.py --run          # into a new run folder in benchmarks/results
    python benchmarks/targets.py --collectives C1.json C2.json --fusion F.json --train T1.json T2.json

--run launches the three benchmarks, 2 ranks each: the collectives benchmark --repeats times
(3 by default, about a minute each), the fusion benchmark once, the training study --repeats
times (about 3 minutes each; skip it with --no-train). Their JSON and plots and the table go into
a new run folder, benchmarks/results/<date>_<machine>_targets/ with its MANIFEST.json, or into
--out DIR/, or next to --out PREFIX as before; without --run the named JSON files are read.
Every figure is the median over the repeats (this VM moves single points by 10-60% between
runs). Targets (2 ranks):
  1. small messages, 8 B - 4 KiB: a blocking all_reduce costs at most raw MPI + 10 us and at
     least 10x less than gloo;
  2. large messages, >= 1 MiB: at most 1.05x raw MPI for all_reduce, all_gather,
     reduce_scatter, broadcast and all_to_all;
  3. fusion: 1000 x 1 KiB through one coalesced call at most 1.5x one all_reduce of the bytes;
  4. training (2 ranks x 1 thread): images/s at least sequential training with 2 threads for
     every model, and ahead of gloo on the MLP.
Nothing here asserts: the table is the result, and it is printed whatever it says.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

LARGE_OPS = ["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"]


def run(cmd, cwd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    print("$ " + " ".join(cmd), flush=True)
    # not from the repository root: there `import torch_mpi_gpu` finds the sources, not the build
    proc = subprocess.run(cmd, env=env, cwd=cwd, text=True, capture_output=True)
    print(proc.stdout[-4000:], flush=True)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
    return proc.returncode


def measure(out, repeats, train):
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    from torch_mpi_gpu.mpirun import launch_command, mpirun_path
    np2 = launch_command(mpirun_path(), 2, {})
    files = {"collectives": [f"{out}_collectives{i + 1}.json" for i in range(repeats)],
             "fusion": f"{out}_fusion.json",
             "train": [f"{out}_train{i + 1}.json" for i in range(repeats if train else 0)]}
    for i, path in enumerate(files["collectives"]):
        plot = ["--plot", f"{out}_collectives.png"] if i == 0 else []
        run(np2 + [sys.executable, "-m", "torch_mpi_gpu.bench", "-b", "8", "-e", "16M", "-f", "8",
                   "-n", "100", "--backends", "mpigpu,gloo,mpi", "--no-progress",
                   "--json", path] + plot, out.parent)
    run(np2 + [sys.executable, str(here / "fusion_bench.py"), "--n", "1000", "--sizes", "1024",
               "--json", files["fusion"]], out.parent)
    for path in files["train"]:
        run([sys.executable, str(here / "train_study.py"), "--ranks", "1,2", "--out",
             path[:-len(".json")]], out.parent)
    return files


def median(rows, op, size, backend):
    """The median over the runs of each run's median time for one point (None if missing)."""
    got = [r["median_us"] for r in rows
           if r["op"] == op and r["bytes"] == size and r["backend"] == backend and "median_us" in r]
    return statistics.median(got) if got else None


def verdict(ok):
    return "met" if ok else "NOT MET"


def score(collectives, fusion, train):
    lines = []
    add = lines.append
    if collectives:
        runs = [json.loads(Path(c).read_text()) for c in collectives]
        rows, head = [r for d in runs for r in d["rows"]], runs[0]["header"]
        add(f"# collectives: {head.get('host')} | {head.get('cpu')} | torch {head.get('torch')} | "
            f"{str(head.get('mpi')).split(',')[0]} | {head.get('ranks')} ranks | median of "
            f"{len(runs)} run(s) of {head.get('iters')} iterations")
        sizes = sorted({r["bytes"] for r in rows if r["op"] == "allreduce"})
        add("\n1. small messages: blocking all_reduce <= raw MPI + 10 us and >= 10x faster than gloo")
        add(f"{'bytes':>8} {'mpigpu us':>10} {'mpi us':>8} {'over mpi':>9} {'gloo us':>9} "
            f"{'gloo/mpigpu':>12}  verdict")
        for s in [s for s in sizes if s <= 4096]:
            ours, raw, gloo = (median(rows, "allreduce", s, b) for b in ("mpigpu", "mpi", "gloo"))
            if None in (ours, raw, gloo):
                add(f"{s:>8}  (missing a backend)")
                continue
            add(f"{s:>8} {ours:>10.1f} {raw:>8.1f} {ours - raw:>9.1f} {gloo:>9.1f} {gloo / ours:>12.1f}"
                f"  {verdict(ours - raw <= 10 and gloo / ours >= 10)}")
        add("\n2. large messages: mpigpu / raw MPI <= 1.05")
        big = [s for s in sizes if s >= 1 << 20]
        add(f"{'op':>15} " + " ".join(f"{s:>10}" for s in big) + "  verdict")
        for op in LARGE_OPS:
            ratios = []
            for s in big:
                ours, raw = median(rows, op, s, "mpigpu"), median(rows, op, s, "mpi")
                ratios.append(ours / raw if ours and raw else None)
            shown = " ".join(f"{r:>10.2f}" if r else f"{'-':>10}" for r in ratios)
            add(f"{op:>15} {shown}  {verdict(all(r is not None and r <= 1.05 for r in ratios))}")
        add("\n   for reference, every op at 8 B (us; mpigpu / raw MPI / gloo):")
        for op in LARGE_OPS + ["sendrecv"]:
            vals = [median(rows, op, 8, b) for b in ("mpigpu", "mpi", "gloo")]
            add(f"{op:>15} " + " / ".join(f"{v:.1f}" if v else "-" for v in vals))
    if fusion:
        data = json.loads(Path(fusion).read_text())
        add("\n3. fusion: 1000 x 1 KiB in one coalesced call <= 1.5x one all_reduce of the same bytes")
        rows = [r for r in data["rows"] if r["n"] == 1000 and r["bytes_each"] == 1024]
        if not rows:
            add("   (no 1000 x 1 KiB row: run fusion_bench.py --n 1000 --sizes 1024)")
        for r in rows:
            add(f"   coalesced {r['coalesced_ms']:.3f} ms, one big {r['one_big_ms']:.3f} ms, "
                f"separate {r['separate_ms']:.3f} ms: ratio {r['coalesced_vs_big']:.2f}  "
                f"{verdict(r['coalesced_vs_big'] <= 1.5)}")
    if train:
        studies = [json.loads(Path(t).read_text()) for t in train]
        runs = [r for d in studies for r in d["runs"] if "error" not in r]

        def ips(model, backend, ranks, threads):
            got = [r["images_per_s"] for r in runs
                   if (r["model"], r["backend"], r["ranks"], r["threads"]) == (model, backend, ranks, threads)]
            return statistics.median(got) if got else None

        add(f"\n4. training, images/s, median of {len(studies)} run(s) "
            f"({studies[0]['header'].get('machine')}): mpigpu 2 ranks x 1 thread >= sequential "
            "2 threads; ahead of gloo on the MLP")
        add(f"{'model':>6} {'seq 1 thr':>10} {'seq 2 thr':>10} {'mpigpu 2':>10} {'gloo 2':>10} "
            f"{'vs seq2':>8} {'vs gloo':>8}  verdict")
        for model in sorted({r["model"] for r in runs}):
            s1, s2 = ips(model, "none", 1, 1), ips(model, "none", 1, 2)
            ours, gloo = ips(model, "mpigpu", 2, 1), ips(model, "gloo", 2, 1)
            if None in (s2, ours, gloo):
                add(f"{model:>6}  (missing a run)")
                continue
            ok = ours >= s2 and (model != "mlp" or ours > gloo)
            add(f"{model:>6} {s1 or 0:>10.0f} {s2:>10.0f} {ours:>10.0f} {gloo:>10.0f} "
                f"{ours / s2:>8.2f} {ours / gloo:>8.2f}  {verdict(ok)}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="run the benchmarks first (2 ranks)")
    ap.add_argument("--no-train", action="store_true", help="with --run: skip the training study")
    ap.add_argument("--repeats", type=int, default=3, help="with --run: runs of the collectives "
                    "benchmark and of the training study")
    ap.add_argument("--out", default="", help="with --run: the folder (DIR/) or prefix of the files "
                    "written (default: a new run folder in benchmarks/results)")
    ap.add_argument("--collectives", nargs="*", default=[], help="collectives benchmark JSON files")
    ap.add_argument("--fusion")
    ap.add_argument("--train", nargs="*", default=[], help="one or more train_study JSON files")
    args = ap.parse_args()
    files = {"collectives": args.collectives, "fusion": args.fusion, "train": args.train}
    if args.run:
        from torch_mpi_gpu.manifest import run_paths, write_manifest
        folder, out = run_paths(args.out, "targets", "targets")
        if folder:  # before the benchmarks: what runs, on what
            write_manifest(folder, "The CPU performance scorecard (benchmarks/targets.py): collectives x"
                           f"{args.repeats}, fusion, " + ("no training study" if args.no_train else
                                                          f"training study x{args.repeats}"), "1, 2")
        files = measure(out, args.repeats, not args.no_train)
    text = score(files["collectives"], files["fusion"], files["train"])
    print(text)
    if args.run:
        Path(f"{out}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
