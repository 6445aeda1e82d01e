"""PyTorch's own backend test suite (`DistributedTest._DistTestBase` from the installed torch's
`torch/testing/_internal/distributed/distributed_test.py`) run against mpigpu under mpirun.

    python tests/torch_suite.py -np 3 [-k PATTERN] [--backend mpigpu|gloo] [--timeout 120]

torch runs this suite with its own test harness, which forks one process per rank; MPI ranks
come from the launcher instead. So every rank of one mpirun job runs the same tests in the
same order: per test, a fresh default group (as torch's harness does), torch's file barrier,
the test method, every rank meeting through the test's store, destroy. A test that hangs past
--timeout ends its job (the rank prints its stack and exits); the driver records it as TIMEOUT
and starts a new job at the next test. A test passes when it passes on every rank. The last line is the summary.

Adaptations, and why each is honest:
- BACKEND=mpigpu. The suite's decorators read the backend name. DistTestCases.backend_feature
  lists which backends have a feature; mpigpu is added to the sets gloo is in ("gpu", "cuda",
  "ddp", "subgroup"): gloo is there for its CPU support of those features, which mpigpu has
  (CUDA tests still skip without GPUs, through their own GPU-count checks).
- backend_feature["plugin"] gets mpigpu: it is torch's own list of registered third-party
  backends, which its availability check (require_backend_is_available) accepts.
- skip_collective: mpigpu has every collective, so it is in none of its sets.
- Tests skipped by a decorator whose reason is a feature mpigpu has run anyway (TAKEN below,
  each with why); the test itself is unchanged, so it fails loudly if the claim is wrong.
- Tests that exit with torch's skip codes (TEST_SKIPS, e.g. "no_cuda") are reported as skipped
  with that reason, as torch's harness does.
Nothing else is changed: assertions, tolerances and the tests' own backend branches are torch's.
"""

import argparse
import faulthandler
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import unittest
from pathlib import Path

HERE = Path(__file__).resolve()
# (skip reason, tests it applies to, why mpigpu deserves the branch the test takes otherwise)
TAKEN = [
    (r"^Only MPI supports (CPU )?all_to_all", r".",
     "mpigpu is an MPI backend: all_to_all and all_to_all_single on CPU tensors are MPI_Alltoall(v)"),
    # (not test_accumulate_gradients_no_sync*: their bodies build the model for mpi, gloo and
    # nccl only, by BACKEND branches at run time, so they cannot run under another name)
    (r"^get_future is only supported on mpi, nccl and gloo", r"^test_get_future$",
     "mpigpu's Work implements get_future (DDP comm hooks use it)"),
    (r"^GLOO Batch Send Recv CPU", r".",
     "batch_isend_irecv on CPU tensors, which mpigpu has (the gloo in the name is the backend "
     "torch knew for it)"),
    (r"^Only Gloo backend supports sparse all reduce", r"^test_sparse_all_reduce_sum",
     "mpigpu all-reduces sparse COO tensors too (every rank gathers the entries and sums them, "
     "as gloo does)"),
    (r"^Test requires backend \S+ to be one of \{'gloo'\}",
     r"^test_(all_reduce_coalesced|scatter_object_list|grads_same_across_ranks_with_no_sync)",
     "CPU features gloo has and mpigpu has too: all_reduce_coalesced, scatter of objects, "
     "DDP no_sync"),
]
# Tests that fail on mpigpu for a reason outside this project.
KNOWN = {
    "test_ddp_logging_data_cpu":
        "torch names every third-party backend 'custom' in DDP's logging data "
        "(ProcessGroup::getBackendName maps BackendType::CUSTOM to 'custom'; our backend's own "
        "getBackendName says 'mpigpu'); only torch can change that",
}
# What the known failure's message must contain on every rank to count as that failure.
KNOWN_FAILS_WITH = {"test_ddp_logging_data_cpu": "'custom'"}
# Tests gloo passes that do not pass on mpigpu, and why (compared by test_torch_suite.py).
GLOO_ONLY = {
    "test_barrier_timeout_full_group": "gloo's barrier gives up after its timeout and the group "
        "stays usable; an MPI barrier cannot be cancelled (mpigpu's watchdog ends the job)",
    "test_monitored_barrier_gloo": "torch routes monitored_barrier to gloo only",
    "test_monitored_barrier_gloo_rank_0_timeout": "torch routes monitored_barrier to gloo only",
    "test_monitored_barrier_gloo_subgroup": "torch routes monitored_barrier to gloo only",
    "test_accumulate_gradients_no_sync": "the test builds its model for mpi, gloo and nccl only "
        "(BACKEND branches in its body)",
    "test_accumulate_gradients_no_sync_allreduce_hook": "as test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook":
        "as test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_grad_is_view": "as test_accumulate_gradients_no_sync",
    **KNOWN,
}
RESULT = re.compile(r"^SUITE (\S+) rank (\d+) (PASS|FAIL|ERROR|SKIP)(?: (.*))?$")


def load_suite(backend):
    """The test class, with the adaptations above; import only after BACKEND is set."""
    os.environ["BACKEND"] = backend
    from torch.testing._internal import common_distributed as cd
    if backend not in ("gloo", "nccl"):
        for feature in ("gpu", "cuda", "ddp", "subgroup", "plugin"):
            cd.DistTestCases.backend_feature[feature].add(backend)
    from torch.testing._internal.common_utils import TestCase
    from torch.testing._internal.distributed import distributed_test as dt

    # torch's TestCase, as its harness uses (its assertEqual compares tensors)
    class Suite(dt.DistributedTest._DistTestBase, TestCase):
        @property
        def world_size(self):
            return os.environ["WORLD_SIZE"]

    if backend not in ("gloo", "nccl"):
        for name in dir(Suite):
            func = getattr(Suite, name)
            why = getattr(func, "__unittest_skip_why__", "")
            if name.startswith("test_") and getattr(func, "__unittest_skip__", False) and any(
                    re.search(reason, why) and re.search(tests, name)
                    for reason, tests, _ in TAKEN):
                func.__unittest_skip__ = False
    return Suite, dt, cd


def rank_side(args):
    import torch.distributed as dist

    import torch_mpi_gpu
    from torch_mpi_gpu import _C

    rank, world = _C.mpi_info()["world_rank"], _C.mpi_info()["world_size"]
    os.environ["WORLD_SIZE"] = str(world)
    Suite, dt, cd = load_suite(args.backend)
    names = sorted(n for n in dir(Suite) if n.startswith("test_"))
    if args.k:
        names = [n for n in names if re.search(args.k, n)]
    names = names[args.start:]
    skip_codes = {v.exit_code: v.message for v in cd.TEST_SKIPS.values()}
    from datetime import timedelta
    for name in names:
        print(f"SUITE-START {name}", flush=True)
        faulthandler.dump_traceback_later(args.timeout, exit=True)
        torch_mpi_gpu.setup_env(force=True)  # a fresh store for each test's group
        dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
        if rank == 0:
            dt.Barrier.init()
        dist.barrier()
        dt.Barrier.barrier_id = 0
        test = Suite(name)
        test.rank = rank
        test.file_name = os.path.join(os.environ["TEMP_DIR"], "init_file")
        result = unittest.TestResult()
        outcome, detail = "PASS", ""
        try:
            test.run(result)
        except SystemExit as e:  # torch's skip decorators exit the (forked) process
            result.skipped.append((test, skip_codes.get(e.code, f"exit {e.code}")))
        # torch's skip decorators sys.exit() with a TEST_SKIPS code (its harness forks per rank);
        # unittest reports that as an error
        for failed in list(result.errors):
            code = re.search(r"SystemExit: (\d+)\s*$", failed[1])
            if code and int(code.group(1)) in skip_codes:
                result.errors.remove(failed)
                result.skipped.append((test, skip_codes[int(code.group(1))]))
        if result.skipped:
            outcome, detail = "SKIP", str(result.skipped[0][1]).splitlines()[0][:200]
        elif result.failures or result.errors:
            outcome = "FAIL" if result.failures else "ERROR"
            text = (result.failures or result.errors)[0][1]
            lines = [ln for ln in text.strip().splitlines()
                     if ln.strip() and "PYTORCH_PRINT_REPRO_ON_FAILURE" not in ln]
            detail = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1])[:300]
            sys.stderr.write(text)
        try:
            if dist.is_initialized():
                every_rank_done(name, rank, world, args.timeout)
                dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001  (a test that broke its group: report it, go on)
            traceback.print_exc()
            if outcome not in ("FAIL", "ERROR"):
                outcome = "ERROR"
                detail = f"the barrier/destroy after the test failed: {type(e).__name__}: {e}"
                detail = " ".join(detail.split())[:300]
        faulthandler.cancel_dump_traceback_later()
        print(f"SUITE {name} rank {rank} {outcome} {detail}", flush=True)
    return 0


def every_rank_done(name, rank, world, timeout):
    """Waits until every rank has finished the test, before its group goes: through the group's
    store, which wakes the waiter at the last arrival, where torch's file barrier polls every
    0.1 s (up to 0.1 s a test, 285 tests). A test that broke the group leaves its store alone, so
    this still ends (or times out, reported as the test's error)."""
    from datetime import timedelta
    import torch.distributed as dist
    store = dist.distributed_c10d._get_default_store()
    store.set(f"suite-done/{name}/{rank}", "1")
    store.wait([f"suite-done/{name}/{r}" for r in range(world)], timedelta(seconds=timeout))


def mpirun_cmd(np, env):
    """The launch line passing every rank the variables of `env` (with their values)."""
    sys.path.insert(0, str(HERE.parent))
    from conftest import launch_command
    return launch_command(np, env)


def driver(args):
    sys.path.insert(0, str(HERE.parent))
    from conftest import launch_env
    outcomes = {}  # test -> {rank: (outcome, detail)}
    order = []
    start = 0
    began = time.monotonic()
    while True:
        with tempfile.TemporaryDirectory() as tmp:
            for sub in ("barrier", "test_dir", "init_dir"):  # as initialize_temp_directories
                os.mkdir(os.path.join(tmp, sub))
            passed = {"TEMP_DIR": tmp, "WORLD_SIZE": str(args.np)}
            env = launch_env({**passed, "TORCH_MPIGPU_TIMEOUT": str(args.timeout),
                              "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"})
            cmd = mpirun_cmd(args.np, passed) + [sys.executable, str(HERE), "--rank-side",
                                          "--backend", args.backend, "--timeout",
                                          str(args.timeout), "--start", str(start)]
            if args.k:
                cmd += ["-k", args.k]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE.parent,
                                  timeout=args.job_timeout)
        started = re.findall(r"^SUITE-START (\S+)$", proc.stdout, re.M)
        for line in proc.stdout.splitlines():
            m = RESULT.match(line)
            if m:
                name, rank, outcome, detail = m.groups()
                if name not in outcomes:
                    outcomes[name] = {}
                    order.append(name)
                outcomes[name][int(rank)] = (outcome, detail or "")
        if args.verbose:
            sys.stdout.write(proc.stdout[-20000:] + proc.stderr[-20000:])
        finished = [n for n in dict.fromkeys(started) if len(outcomes.get(n, {})) == args.np]
        if proc.returncode == 0 or not started:
            if proc.returncode != 0 and not started:
                print(proc.stdout[-3000:] + proc.stderr[-3000:])
                raise SystemExit(f"the suite's job failed before any test: exit {proc.returncode}")
            break
        # the job ended early: the first test without every rank's result stopped it
        stuck = next(n for n in dict.fromkeys(started) if n not in finished)
        outcomes.setdefault(stuck, {})
        if stuck not in order:
            order.append(stuck)
        for r in range(args.np):
            outcomes[stuck].setdefault(r, ("TIMEOUT", f"job ended in this test (exit "
                                                      f"{proc.returncode})"))
        print(f"{stuck}: the job ended in this test (exit {proc.returncode}); "
              f"tail:\n{(proc.stdout + proc.stderr)[-2500:]}", flush=True)
        start += len(dict.fromkeys(started))
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0, "KNOWN": 0}
    lines = []
    for name in order:
        per_rank = outcomes[name]
        kinds = {o for o, _ in per_rank.values()}
        if kinds == {"PASS"}:
            kind = "PASS"
        elif kinds == {"SKIP"}:
            kind = "SKIP"
        elif args.backend not in ("gloo", "nccl") and name in KNOWN and kinds == {"FAIL"} and all(
                KNOWN_FAILS_WITH[name] in d for _, d in per_rank.values()):
            # only the known assertion on every rank (an error, a timeout or another message
            # is a failure)
            kind = "KNOWN"
        else:
            kind = "FAIL"
        counts[kind] += 1
        detail = next((d for o, d in per_rank.values() if o != "PASS"), "")
        if kind == "KNOWN":
            detail = KNOWN[name]
        lines.append(f"{kind} {name} {detail}".rstrip())
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text + "\n")
    for line in lines:
        if line.startswith("FAIL") or args.verbose:
            print(line)
    print(f"torch suite ({args.backend}, {args.np} ranks): {counts['PASS']} passed, "
          f"{counts['FAIL']} failed, {counts['KNOWN']} known failures, {counts['SKIP']} skipped "
          f"in {time.monotonic() - began:.0f} s")
    return 1 if counts["FAIL"] else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-np", type=int, default=3)
    ap.add_argument("-k", help="regular expression: run the matching tests only")
    ap.add_argument("--backend", default="mpigpu")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test")
    ap.add_argument("--job-timeout", type=int, default=3600)
    ap.add_argument("--out", help="write one line per test here")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    return rank_side(args) if args.rank_side else driver(args)


if __name__ == "__main__":
    sys.exit(main())
