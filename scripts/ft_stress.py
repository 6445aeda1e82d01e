#!/usr/bin/env python3
"""Kill-point stress for #70 (the longer mode of tests/test_fault_tolerance.py): tests/mp/survive.py
at every kill point x layout x victim, --runs times each, under a fault-tolerant launch
(torch_mpi_gpu.mpirun's --fault-tolerant flags). Prints one line per run and writes a JSON list
and a markdown table (kill points x layouts: runs passed, times to the error) to --out.

    python scripts/ft_stress.py --runs 3 --out benchmarks/results/DIR
    python scripts/ft_stress.py --runs 1 --layouts one-host --points allreduce,idle

Layouts: one-host-3 (victim 1), one-host-4 (victim 2), two-hosts-h1 (4 ranks, victim 1 on the
second host), two-hosts-h0 (4 ranks, victim 2 on the first host beside rank 0), two-hosts-3-h1 (3
ranks, victim 1 the second host's only rank: that host loses all its ranks); two-hosts-* need
root and scripts/two_hosts.sh (brought up here). Rank 0 hosts the store and never dies."""

import argparse
import json
import os
from pathlib import Path
import re
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
POINTS = ("allreduce", "p2p", "new_group", "ddp", "idle")
LAYOUTS = {"one-host-3": (3, 1, False), "one-host-4": (4, 2, False),
           "two-hosts-h1": (4, 1, True), "two-hosts-h0": (4, 2, True),
           "two-hosts-3-h1": (3, 1, True)}


def run_once(layout, point, timeout):
    from torch_mpi_gpu import mpirun as m
    np, victim, two = LAYOUTS[layout]
    mpirun = m.mpirun_path()
    with tempfile.TemporaryDirectory() as tmp:
        kill_file = str(Path(tmp) / "killed")
        prog = [sys.executable, str(ROOT / "tests" / "mp" / "survive.py"), point, str(victim),
                kill_file]
        if two:
            cmd = [str(ROOT / "scripts" / "two_hosts.sh"), "mpirun", "-np", str(np),
                   "-x", "PYTHONUNBUFFERED", "-x", "OMP_NUM_THREADS"]
        else:
            cmd = m.launch_command(mpirun, np, {"PYTHONUNBUFFERED": None, "OMP_NUM_THREADS": None})
        cmd += m.fault_tolerant_flags(mpirun) + prog
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   PATH=f"{Path(mpirun).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        start = time.monotonic()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = str(e.stdout or "") + str(e.stderr or ""), "timeout"
        took = time.monotonic() - start
    ok = [float(s) for s in re.findall(r"SURVIVE OK rank \d+ point \S+ error_after ([\d.]+)", out)]
    fails = re.findall(r"SURVIVE FAIL [^\n]*", out)
    passed = len(ok) == np - 1 and not fails and rc != "timeout"
    return {"layout": layout, "point": point, "np": np, "victim": victim, "passed": passed,
            "times_to_error_s": ok, "failures": fails[:3], "exit": rc, "seconds": round(took, 1),
            "tail": "" if passed else out[-1500:]}


def table(results):
    lines = ["| kill point | " + " | ".join(LAYOUTS) + " |",
             "|---|" + "---|" * len(LAYOUTS)]
    for point in POINTS:
        cells = []
        for layout in LAYOUTS:
            rs = [r for r in results if r["point"] == point and r["layout"] == layout]
            if not rs:
                cells.append("-")
                continue
            times = [t for r in rs for t in r["times_to_error_s"]]
            span = f"{min(times):.2f}-{max(times):.2f} s" if times else "no error seen"
            cells.append(f"{sum(r['passed'] for r in rs)}/{len(rs)}, {span}")
        lines.append(f"| {point} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--points", default=",".join(POINTS))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    layouts = [lay for lay in LAYOUTS if any(lay.startswith(x) for x in a.layouts.split(","))]
    if any(LAYOUTS[lay][2] for lay in layouts):
        subprocess.run([str(ROOT / "scripts" / "two_hosts.sh"), "up", "names"], check=True)
    results = []
    for layout in layouts:
        for point in a.points.split(","):
            for run in range(a.runs):
                r = run_once(layout, point, a.timeout)
                results.append(r)
                print(f"{layout} {point} run {run + 1}: {'ok' if r['passed'] else 'FAILED'} "
                      f"times {r['times_to_error_s']} exit {r['exit']} in {r['seconds']} s"
                      + ("" if r["passed"] else "\n" + r["tail"]), flush=True)
    print(table(results))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "ft_stress.json").write_text(json.dumps(results, indent=1))
        (a.out / "ft_stress_table.md").write_text(table(results) + "\n")
    sys.exit(0 if all(r["passed"] for r in results) else 1)


if __name__ == "__main__":
    main()
