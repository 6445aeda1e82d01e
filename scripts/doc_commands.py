#!/usr/bin/env python3
"""Runs the shell commands that README.md and docs/*.md show, as written, from the repository root.

Every fenced block in bash, sh, console or shell carries a marker after its language:

    ```bash run              runs here: a CPU machine, from the repository root, after
                             ./scripts/run_main.sh, with its venv (.venv) first on PATH
    ```bash needs=WHAT       needs what this machine lacks: gpu, cuda-mpi, slurm, two-hosts,
                             source-tarball; ci (the test command itself); long (runs for
                             many minutes: a benchmark sweep)
    ```bash illustration     a pattern with placeholders, not meant to run as written

Each `run` block goes to `bash -e -o pipefail` with a time limit; a non-zero exit or a Python
traceback in its output fails it. A shell block without a marker fails the check, and so does an
example in examples/ that no `run` or `needs=` block runs. It prints one line per block and a
summary: how many ran, how many need another leg (by what), how many are illustrations.

    python scripts/doc_commands.py [--list] [--only FILE[:LINE]] [--timeout SECONDS]

--list checks the markers and the examples without running anything (tests/test_docs.py).
"""

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELLS = {"bash", "sh", "console", "shell"}
NEEDS = {"gpu", "cuda-mpi", "slurm", "two-hosts", "source-tarball", "ci", "long"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)


@dataclass
class Block:
    path: Path
    line: int
    marker: str  # run, needs=..., illustration, or "" (unmarked)
    body: str

    @property
    def where(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def shell_blocks(path):
    text = path.read_text()
    for match in FENCE.finditer(text):
        words = match.group("info").split()
        if not words or words[0] not in SHELLS:
            continue
        line = text.count("\n", 0, match.start()) + 1
        yield Block(path, line, words[1] if len(words) > 1 else "", match.group("body"))


def marker_problem(block):
    marker = block.marker
    if marker in ("run", "illustration"):
        return None
    if marker.startswith("needs=") and marker[len("needs="):] in NEEDS:
        return None
    return (f"{block.where}: shell block marked {marker or 'nothing'!r}; mark it `run`, "
            f"`illustration` or `needs=` one of {', '.join(sorted(NEEDS))}")


def unrun_examples(blocks):
    """Examples that no runnable or needs= block starts (itself or through a script of scripts/
    that it calls)."""
    shown = "\n".join(b.body for b in blocks if b.marker == "run" or b.marker.startswith("needs="))
    for script in set(re.findall(r"scripts/[\w.-]+\.sh", shown)):
        if (ROOT / script).exists():
            shown += (ROOT / script).read_text()
    return [p.relative_to(ROOT) for p in sorted((ROOT / "examples").glob("*.py"))
            if str(p.relative_to(ROOT)) not in shown]


def environment():
    """As a reader who ran ./scripts/run_main.sh and activated its venv would have it."""
    env = dict(os.environ)
    venv = Path(os.environ.get("MPIGPU_VENV", ROOT / ".venv"))
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    env.setdefault("OMPI_MCA_btl", "^ofi")  # no fabric here: saves ~1 s of MPI_Init per job
    if os.geteuid() == 0:  # what a reader running as root sets for Open MPI's own mpirun
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def run(block, timeout):
    start = time.monotonic()
    try:
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.body], cwd=ROOT,
                              env=environment(), capture_output=True, text=True, timeout=timeout)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        code = f"timeout after {timeout} s"
    seconds = time.monotonic() - start
    failed = code != 0 or "Traceback (most recent call last)" in output
    return failed, code, seconds, output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="check markers only, run nothing")
    parser.add_argument("--only", help="FILE or FILE:LINE of one document's blocks")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per block (240)")
    args = parser.parse_args(argv)

    blocks = [b for path in doc_files() for b in shell_blocks(path)]
    problems = [p for p in map(marker_problem, blocks) if p]
    problems += [f"examples: {e} is run by no `run` or `needs=` block of README.md or docs/"
                 for e in unrun_examples(blocks)]
    if args.only:
        blocks = [b for b in blocks if b.where == args.only or b.where.startswith(args.only + ":")]

    counts = Counter()
    failures = []
    for block in blocks:
        if block.marker != "run":
            counts["illustration" if block.marker == "illustration" else block.marker] += 1
            continue
        if args.list:
            print(f"would run {block.where}: {block.body.strip().splitlines()[0]}")
            counts["run"] += 1
            continue
        failed, code, seconds, output = run(block, args.timeout)
        counts["run"] += 1
        print(f"{'FAILED' if failed else 'ok    '} {block.where} ({seconds:.1f} s, exit {code}): "
              f"{block.body.strip().splitlines()[0]}", flush=True)
        if failed:
            failures.append(block.where)
            print("\n".join("    " + line for line in output.strip().splitlines()[-40:]), flush=True)

    needs = {k: v for k, v in counts.items() if k.startswith("needs=")}
    print(f"doc commands: {counts['run']} {'runnable' if args.list else 'ran'}, "
          f"{sum(needs.values())} need another leg ("
          + ", ".join(f"{k[len('needs='):]} {v}" for k, v in sorted(needs.items()))
          + f"), {counts['illustration']} illustration; {len(failures)} failed")
    for problem in problems:
        print(f"MARKER: {problem}")
    return 1 if failures or problems else 0


if __name__ == "__main__":
    sys.exit(main())
