"""PyTorch's own distributed backend suite (DistributedTest._DistTestBase of the installed torch)
on mpigpu at 2 and 3 ranks, with gloo in the same harness as the control (its passes recorded per
torch version in tests/torch_suite_gloo.txt, run again for another torch). tests/torch_suite.py
says how it runs and what it adapts; tests/torch_suite_skips.txt lists every test the suite
skips on mpigpu, with the suite's own reason."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_suite
from conftest import require_library, skip_or_fail

HERE = Path(__file__).resolve().parent
SKIPS = HERE / "torch_suite_skips.txt"
GLOO_PASSES = HERE / "torch_suite_gloo.txt"


def run_suite(np, backend, tmp_path):
    out = tmp_path / f"{backend}{np}.txt"
    proc = subprocess.run([sys.executable, str(HERE / "torch_suite.py"), "-np", str(np),
                           "--backend", backend, "--timeout", "120", "--out", str(out)],
                          capture_output=True, text=True, timeout=2400, cwd=HERE)
    if not out.exists():
        pytest.fail(f"the suite ({backend}, {np} ranks) reported nothing:\n"
                    f"{(proc.stdout + proc.stderr)[-4000:]}")
    results = {}
    for line in out.read_text().splitlines():
        kind, name, *rest = line.split(" ", 2)
        results[name] = (kind, rest[0] if rest else "")
    return proc.stdout.strip().splitlines()[-1], results


def recorded_gloo_passes(np):
    """{test} gloo passed at `np` ranks when recorded, and the torch version it ran with."""
    version, passes = None, set()
    for line in (GLOO_PASSES.read_text().splitlines() if GLOO_PASSES.exists() else []):
        if line.startswith("# torch "):
            version = line.split()[2]
        elif line and not line.startswith("#"):
            n, name = line.split(" ", 1)
            if int(n) == np:
                passes.add(name)
    return version, passes


def gloo_passes(np, tmp_path):
    """What gloo, the control, passes: recorded for this torch (tests/torch_suite_gloo.txt; gloo
    is not what we test, and its run cost CI 2 minutes), else run here. MPIGPU_TORCH_SUITE_GLOO=1
    runs it anyway (to re-record: the PASS lines of `torch_suite.py --backend gloo` as 'N test')."""
    version, passes = recorded_gloo_passes(np)
    if version == torch.__version__ and passes and os.environ.get("MPIGPU_TORCH_SUITE_GLOO") != "1":
        return f"gloo: {len(passes)} passed (recorded with torch {version})", passes
    summary, gloo = run_suite(np, "gloo", tmp_path)
    return summary, {n for n, (k, _) in gloo.items() if k == "PASS"}


def committed_skips(np):
    """{test: reason} for `np` ranks, and the torch version the list was recorded with."""
    version, skips = None, {}
    for line in SKIPS.read_text().splitlines():
        if line.startswith("# torch "):
            version = line.split()[2]
        elif line and not line.startswith("#"):
            n, name, reason = line.split(" ", 2)
            if int(n) == np:
                skips[name] = reason
    return version, skips


@pytest.mark.parametrize("np", [2, 3])
def test_pytorch_distributed_suite(np, tmp_path):
    require_library("expecttest")  # torch's test helpers need it
    summary, mine = run_suite(np, "mpigpu", tmp_path)
    print(summary)
    failed = {n: d for n, (k, d) in mine.items() if k == "FAIL"}
    assert not failed, f"{summary}\n" + "\n".join(f"{n}: {d}" for n, d in failed.items())
    # gloo, the control: what it passes, mpigpu passes too, except what GLOO_ONLY explains
    gloo_summary, gloo = gloo_passes(np, tmp_path)
    print(gloo_summary)
    lost = [n for n in sorted(gloo)
            if mine.get(n, ("?",))[0] != "PASS" and n not in torch_suite.GLOO_ONLY]
    assert not lost, f"gloo passes these, mpigpu does not: {lost}"
    # every skip is a committed, explained one, and none is missing (a lost test is loud too)
    version, expected = committed_skips(np)
    skipped = {n: d for n, (k, d) in mine.items() if k == "SKIP"}
    assert sum(k == "PASS" for k, _ in mine.values()) >= 80, summary
    if version != torch.__version__:
        # another torch has another suite: record its skip list (see the file's header)
        skip_or_fail("torch-version", f"tests/torch_suite_skips.txt was recorded with torch "
                     f"{version}, this is {torch.__version__} ({len(skipped)} skipped here)")
    assert set(skipped) == set(expected), (
        f"skipped now but not listed: {sorted(set(skipped) - set(expected))}; listed but not "
        f"skipped now: {sorted(set(expected) - set(skipped))} (tests/torch_suite_skips.txt)")
