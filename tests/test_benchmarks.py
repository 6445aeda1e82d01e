"""The benchmarks' own protocols, without a GPU (scripts/gpu_check.sh runs them on the lent one):
the sweep's waits column, the shared-GPU hand-off benchmark on the host, and the
GPU scorecard (benchmarks/gpu_targets.py) on a recorded run and on a made-up one."""

import json
import re
import subprocess
import sys


from helpers import ROOT


def test_the_benchmarks_waits_column_counts_barriers_and_stream_events():
    # waits/op: host and device barriers, then the stream events queued per op (each a device
    # command, a switch on a shared GPU)
    from torch_mpi_gpu.bench import waits_text
    assert waits_text({}) == "-"
    assert waits_text({"node_waits_per_op": {"host": 2.0, "device": 0.0}}) == "2h"
    assert waits_text({"node_waits_per_op": {"host": 2.0, "stream_events": 0.0}}) == "2h"
    assert waits_text({"node_waits_per_op": {"host": 2.0, "stream_events": 2.0}}) == "2h 2e"


def test_the_shared_gpu_handoff_benchmark_runs_its_protocol_on_the_host():
    # benchmarks/shared_gpu_handoff.py (gpu_check.sh runs it on the lent GPU): its two processes'
    # three phases, here with host work, end and print every phase
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "shared_gpu_handoff.py"),
                          "--device", "cpu", "--rounds", "20", "--work-us", "10"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    for phase in ("alone", "stray event", "stray copy", "hand-off"):
        assert re.search(rf"^{phase} +\d+\.\d", out, re.M), out


def test_the_gpu_scorecard_reads_a_lent_gpus_run():
    # benchmarks/gpu_targets.py (gpu_check.sh runs it after its sweeps) on a run folder: a trimmed
    # copy of benchmarks/results/2026-12-04_h200_gpu-check-node-leader/ against the lease before
    # it (-node-ipc) as the baseline: what that run's MANIFEST notes say, target by target
    runs = ROOT / "tests" / "fixtures" / "gpu_runs"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_targets.py"),
                          str(runs / "2026-12-04_h200_gpu-check-node-leader"),
                          "--baseline", str(runs / "2026-12-04_h200_gpu-check-node-ipc")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert re.search(r"^all_reduce 16 MiB <= 0.45 ms +NOT MET +1.13 ms$", out, re.M), out
    assert re.search(r"^all_reduce 256 MiB .* +NOT MET +1.66 ms, 162 GB/s$", out, re.M), out
    assert re.search(r"^all_reduce no slower than the baseline run +NOT MET .*1 MiB 872 us > 475 us",
                     out, re.M), out
    assert re.search(r"^reduce_scatter >= 2x .*NOT MET +32 MiB 1.68x, 256 MiB 1.46x", out, re.M), out
    assert re.search(r"^all_gather >= 2x .*NOT MET +32 MiB 1.70x, 256 MiB 1.24x", out, re.M), out
    assert re.search(r"^mpigpu\[ALGO=node\] +383 us \(2h\) +523 us \(2h\) +1.02 ms \(2h\)$", out, re.M), out


def test_the_gpu_scorecard_says_met_where_a_run_meets_the_targets(tmp_path):
    # a made-up run that meets every target, and one size of all_reduce behind the same run's
    # auto without the node algorithm: each line must say so
    MIB = 1 << 20

    def row(op, nbytes, backend, us, host=0.0):
        return {"op": op, "bytes": nbytes, "backend": backend, "median_us": us,
                "busbw_GBps": nbytes / us / 1e3, "node_waits_per_op": {"host": host}}
    before = "mpigpu[NODE_BUFFER_BYTES=0]"
    ar = [row("allreduce", b, "mpigpu", us, host) for b, us, host in
          ((16, 200, 0), (64 << 10, 150, 0), (MIB, 300, 2), (16 * MIB, 350, 2), (256 * MIB, 900, 2))]
    ar += [row("allreduce", b, before, us) for b, us in
           ((16, 150, ), (64 << 10, 160), (MIB, 800), (16 * MIB, 1100), (256 * MIB, 1600))]
    ot = [row(op, b, be, us) for op in ("reduce_scatter", "allgather")
          for b, be, us in ((32 * MIB, "mpigpu", 300), (32 * MIB, before, 700),
                            (256 * MIB, "mpigpu", 500), (256 * MIB, before, 1100))]
    # as gpu_check.sh writes them, in a run folder; the baseline: an earlier run's auto (071b096's)
    base = [row("allreduce", b, "mpigpu", us) for b, us in ((16, 320), (MIB, 762), (256 * MIB, 1670))]
    (tmp_path / "run").mkdir()
    for name, rows in (("run/allreduce_cuda_2ranks.json", ar), ("run/others_cuda_2ranks.json", ot),
                       ("baseline.json", base)):
        (tmp_path / name).write_text(json.dumps({"header": {}, "rows": rows}))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_targets.py"),
                          str(tmp_path / "run"), "--baseline", str(tmp_path / "baseline.json")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    for target in ("all_reduce 16 MiB", "all_reduce 256 MiB", "<= 2 hand-offs",
                   "than the baseline run", "reduce_scatter >= 2x", "all_gather >= 2x"):
        assert re.search(rf"^[^\n]*{re.escape(target)}[^\n]* met ", out, re.M), (target, out)
    assert re.search(r"^all_reduce no slower than auto without node .* NOT MET +16 B 200 us > 150 us$",
                     out, re.M), out
    # every form at the target sizes, with the leader's host barriers per op
    assert re.search(r"^mpigpu +300 us \(2h\) +350 us \(2h\) +900 us \(2h\)$", out, re.M), out
