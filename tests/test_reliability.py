"""Stalled ranks: the watchdog reports the op after the timeout and ends the job (or only reports
with TORCH_MPIGPU_TIMEOUT_ACTION=report). Launched directly (these jobs are meant to fail)."""

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import MP_DIR, mpirun_command, mpirun_path, run_mpi
from test_multirank import passed_counts


def launch(mode, np, env, script="stall.py", timeout=120):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1", **env)
    cmd = mpirun_command(mpirun_path(), np, dict(env))
    cmd += [sys.executable, str(MP_DIR / script), mode]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=full_env, cwd=MP_DIR, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{script} {mode} at {np} ranks still running after {timeout} s (hang):\n"
                    f"{out[-3000:]}")
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


@pytest.mark.parametrize("mode", ["abort", "abort-async"])
def test_stalled_rank_is_reported_and_ends_the_job(mode):
    rc, out, took = launch(mode, 3, {"TORCH_MPIGPU_TIMEOUT": "2"})
    assert rc != 0, out[-3000:]
    # a waiting rank names the op, its sequence number, its group and the timeout (the first
    # to report ends the job, so the other waiting rank may not get to print); the stalled
    # rank has nothing in flight
    assert re.search(r"WATCHDOG \[rank [02]\]: allreduce \(op #2 of group '\S+', 64 bytes", out), \
        out[-3000:]
    assert "WATCHDOG [rank 1]" not in out
    # and it names the rank that never issued the collective (from the progress in the store)
    assert "This is collective #2 of the group; ranks that had not issued it" in out, out[-3000:]
    assert "1 (has issued 1)" in out, out[-3000:]
    assert "past its timeout of 2 s" in out and "Ending the job (MPI_Abort)" in out, out[-3000:]
    assert "unreachable" not in out
    assert took < 60, f"the job took {took:.0f} s to end"


def test_report_only_lets_a_late_rank_finish():
    out = run_mpi("stall.py", 2, env={"TORCH_MPIGPU_TIMEOUT": "2",
                                      "TORCH_MPIGPU_TIMEOUT_ACTION": "report"}, args=("report",))
    assert "WATCHDOG [rank 0]: allreduce" in out and "the op keeps waiting" in out, out[-3000:]
    assert passed_counts(out, 2) >= 1


def test_killed_rank_ends_the_job():
    rc, out, took = launch("die", 3, {})  # default timeout (30 min): the launcher must end it
    assert rc != 0, out[-3000:]
    assert "unreachable" not in out
    assert took < 60, f"the job took {took:.0f} s to end after a rank was killed"


@pytest.mark.parametrize("mode", ["raise-in-collective", "raise-at-start"])
@pytest.mark.parametrize("np", [2, 3])
def test_uncaught_exception_ends_the_job(mode, np):
    # A real uncaught exception (no os._exit): before the fix the raising rank hung in
    # MPI_Finalize while the others waited in the collective, until the launcher's limit.
    rc, out, took = launch(mode, np, {}, script="exits.py", timeout=60)
    assert rc != 0, out[-3000:]
    assert "fails on purpose" in out and "Traceback" in out, out[-3000:]
    assert "ending all" in out and "MPI_Abort" in out, out[-3000:]
    assert "UNREACHABLE" not in out
    assert took < 30, f"the job took {took:.0f} s to end"


def test_exit_with_async_ops_pending_finishes_cleanly():
    # 20 runs: the queued collectives run in issue order at exit, then MPI finalises; before the
    # fix about half of the runs hung (one rank dropped an op its peer was already inside).
    for i in range(20):
        rc, out, took = launch("pending-async", 2, {}, script="exits.py", timeout=60)
        assert rc == 0, f"run {i}: exit {rc}\n{out[-3000:]}"
        assert out.count("async ops unwaited") == 2, out[-3000:]


def test_clean_exit_finalizes():
    rc, out, took = launch("clean", 3, {}, script="exits.py", timeout=60)
    assert rc == 0 and out.count("clean exit") == 3, out[-3000:]
