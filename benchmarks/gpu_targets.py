"""#22's scorecard for one shared GPU, 2 ranks: each benchmark target, what a `gpu_check.sh` run
measured, the ratio, met / not met; then every node-algorithm form at the target sizes, so the
run says which form would meet them. Nothing here asserts: the table is the result.

    python benchmarks/gpu_targets.py RUN [--baseline EARLIER_RUN]
    python benchmarks/gpu_targets.py ALLREDUCE.json [OTHERS.json] [--baseline ...]

RUN: a run folder of scripts/gpu_check.sh (benchmarks/results/<date>_<gpu>_gpu-check*/: its
allreduce_cuda_2ranks.json and others_cuda_2ranks.json), or those two files named. The baseline
(a run folder or its all_reduce JSON) is the "today" that target 4 compares against.

Targets (issue #22, "Done when", one shared GPU, 2 ranks, fp32 medians):
  1. all_reduce 16 MiB <= 0.45 ms;
  2. all_reduce 256 MiB <= 1.0 ms and >= 270 GB/s bus bandwidth;
  3. at most two cross-process hand-offs per op (the benchmark's host barriers per op, `waits/op`);
  4. no size slower than "today": the baseline run's auto all_reduce at every size both measured,
     and the same run's auto without the node algorithm (`mpigpu[NODE_BUFFER_BYTES=0]`) where present;
  5. reduce_scatter and all_gather >= 2x "today" from 16 MiB: against the same run's auto without
     the node algorithm (or, in runs from before that row existed, auto itself, which then was).
"""

import argparse
import json
from pathlib import Path

MIB = 1 << 20
AUTO, BEFORE = "mpigpu", "mpigpu[NODE_BUFFER_BYTES=0]"
# the sweeps' files in a run folder of scripts/gpu_check.sh
ALLREDUCE_JSON, OTHERS_JSON = "allreduce_cuda_2ranks.json", "others_cuda_2ranks.json"


def load(path):
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {(r["op"], r["bytes"], r["backend"]): r for r in rows if "median_us" in r}


def sweeps(path):
    """(all_reduce JSON, other ops' JSON or None) of a run folder, or the file itself."""
    path = Path(path)
    if path.is_dir():
        others = path / OTHERS_JSON
        return path / ALLREDUCE_JSON, others if others.exists() else None
    return path, None


def us(row):
    return row["median_us"] if row else None


def verdict(ok):
    return "-" if ok is None else ("met" if ok else "NOT MET")


def size(b):
    return f"{b // MIB} MiB" if b >= MIB else f"{b // 1024} KiB" if b >= 1024 else f"{b} B"


def fmt(t_us):
    if t_us is None:
        return "-"
    return f"{t_us:.0f} us" if t_us < 1000 else f"{t_us / 1000:.2f} ms"


def allreduce_targets(ar, today=None):
    """today: a baseline run's rows (load()), or None."""
    lines = []
    r16, r256 = ar.get(("allreduce", 16 * MIB, AUTO)), ar.get(("allreduce", 256 * MIB, AUTO))
    lines.append(("all_reduce 16 MiB <= 0.45 ms", fmt(us(r16)),
                  verdict(r16 and us(r16) <= 450)))
    ok256 = r256 and us(r256) <= 1000 and r256["busbw_GBps"] >= 270
    lines.append(("all_reduce 256 MiB <= 1.0 ms, >= 270 GB/s",
                  f"{fmt(us(r256))}, {r256['busbw_GBps']:.0f} GB/s" if r256 else "-", verdict(ok256)))
    # (MPI's own and the ring count none here: only the node algorithm's host barriers)
    waits = [r["node_waits_per_op"].get("host", 0.0) for (op, b, be), r in ar.items()
             if be == AUTO and op == "allreduce" and r["node_waits_per_op"].get("host")]
    lines.append(("<= 2 hand-offs per op (auto's node ops)",
                  f"at most {max(waits):.3g} per op" if waits else "auto took no node op",
                  verdict(max(waits) <= 2) if waits else "-"))
    slower, compared = [], 0
    for (op, b, be), t in sorted((today or {}).items(), key=lambda kv: kv[0][1]):
        r = ar.get(("allreduce", b, AUTO))
        if op == "allreduce" and be == AUTO and r:
            compared += 1
            if us(r) > us(t):
                slower.append(f"{size(b)} {fmt(us(r))} > {fmt(us(t))}")
    lines.append(("all_reduce no slower than the baseline run",
                  "; ".join(slower) or ("none slower" if compared else
                                        "no baseline (--baseline RUN)" if today is None else "no common size"),
                  verdict(not slower) if compared else "-"))
    same_run = [(b, r, ar.get(("allreduce", b, BEFORE))) for (op, b, be), r in ar.items()
                if be == AUTO and op == "allreduce"]
    behind = [f"{size(b)} {fmt(us(r))} > {fmt(us(o))}" for b, r, o in sorted(same_run, key=lambda x: x[0])
              if o and us(r) > us(o) * 1.05]
    have = any(o for _, _, o in same_run)
    lines.append(("all_reduce no slower than auto without node (this run, 5%)",
                  "; ".join(behind) or ("none slower" if have else "no such row"),
                  verdict(not behind) if have else "-"))
    return lines


def others_targets(ot):
    lines = []
    for op, name in (("reduce_scatter", "reduce_scatter"), ("allgather", "all_gather")):
        sizes = sorted({b for (o, b, be) in ot if o == op and b >= 16 * MIB})
        base = BEFORE if any(k[2] == BEFORE for k in ot) else AUTO
        ratios = []
        for b in sizes:
            now, before = ot.get((op, b, AUTO)), ot.get((op, b, base))
            node = ot.get((op, b, "mpigpu[ALGO=node]"))
            best = now if base == BEFORE else node  # (auto was the old path in such runs)
            if best and before:
                ratios.append((b, us(before) / us(best)))
        text = ", ".join(f"{size(b)} {x:.2f}x" for b, x in ratios) or "-"
        if base != BEFORE:
            text += " (ALGO=node against auto, the old path in this run)"
        lines.append((f"{name} >= 2x before, from 16 MiB", text,
                      verdict(bool(ratios) and all(x >= 2 for _, x in ratios)) if ratios else "-"))
    return lines


def forms(ar, sizes=(MIB, 16 * MIB, 256 * MIB)):
    """Every mpigpu row at the target sizes: which form would meet them."""
    names = sorted({be for (op, b, be) in ar if op == "allreduce" and be.startswith("mpigpu")})
    out = []
    for be in names:
        cells = []
        for b in sizes:
            r = ar.get(("allreduce", b, be))
            cells.append(fmt(us(r)) + (f" ({waits_note(r)})" if r and waits_note(r) else ""))
        out.append((be, cells))
    return out


def waits_note(row):
    """Per op on rank 0, the node's leader: host barriers (h), stream events it queued (e)."""
    w = row.get("node_waits_per_op") or {}
    return " ".join(f"{w[k]:.2g}{tag}" for k, tag in (("host", "h"), ("stream_events", "e"))
                    if w.get(k))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run folder of scripts/gpu_check.sh, or its all_reduce JSON")
    ap.add_argument("others_json", nargs="?", help="the other ops' JSON (default: the run folder's)")
    ap.add_argument("--baseline", help="an earlier run (folder or all_reduce JSON): target 4's 'today'")
    args = ap.parse_args(argv)
    ar_path, others = sweeps(args.run)
    others = args.others_json or others
    ar = load(ar_path)
    today = load(sweeps(args.baseline)[0]) if args.baseline else None
    lines = allreduce_targets(ar, today) + (others_targets(load(others)) if others else [])
    width = max(len(t) for t, _, _ in lines)
    print(f"# #22 on one shared GPU, 2 ranks: {args.run}")
    print(f"# baseline run: {args.baseline or 'none given'}")
    for target, measured, ok in lines:
        print(f"{target:<{width}}  {ok:>7}  {measured}")
    print("\n# all_reduce by form (median; per op on rank 0: h host barriers, o allocations "
          "opened, e stream events)")
    rows = forms(ar)
    width = max([len("backend")] + [len(be) for be, _ in rows]) + 2
    print(f"{'backend':<{width}}{'1 MiB':>20}{'16 MiB':>20}{'256 MiB':>20}")
    for be, cells in rows:
        print(f"{be:<{width}}" + "".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    main()
