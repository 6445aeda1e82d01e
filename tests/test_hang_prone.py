"""Jobs that used to hang intermittently, run repeatedly (#25): the launch check with a subgroup
of one rank per host, p2p_groups, a killed rank, a stalled rank, and a waiting rank's threads'
CPU time. Under the two-host launchers they run at 2 hosts x 2 ranks, with Open MPI binding the
ranks to cores as a plain hostfile does (both simulated hosts share this machine's cores, so two
ranks share each core), filled by slot (ranks 0-1 on h0) and round-robin (ranks 0, 2 on h0)."""

import atexit
import functools
import os
from pathlib import Path
import re
import shutil
import subprocess
import tempfile

import pytest

from conftest import LAUNCHER, MP_DIR, is_hydra, mpirun_path, passed_counts, run_mpi, script_constant
from test_multirank import p2p_groups_behaviours
from test_reliability import launch

TWO_HOSTS = LAUNCHER.startswith("two-hosts")
NP = 4  # 2 hosts x 2 ranks under the two-host launchers
# How often the launch check runs across two hosts: 6 by slot and 3 round-robin by name, 5 by
# slot by IP only (what changes there is how ranks find the rendezvous): 11 runs bound to cores
# per CI run, where the hang of #25 showed in 7 of 10, so all 11 passing with it present has odds
# of about 2 in a million (its fix was shown on 20 of 20 and 20 of 20; 22 runs a CI run until the
# CI budget needed the minute); MPIGPU_TEST_REPEAT, or 3, on one host.
# Under MPICH's Hydra across the hosts (which binds nothing, and whose progress is not Open MPI's)
# 2 and 1: a plain launch check there.
HYDRA = is_hydra(mpirun_path())
SEQUENCE_RUNS = ({"slot": 2, "node": 1} if HYDRA else
                 {"slot": 5 if LAUNCHER == "two-hosts-ip-only" else 6, "node": 3}) if TWO_HOSTS else {
    "default": int(os.environ.get("MPIGPU_TEST_REPEAT", "3"))}
# the sections each script reports (defined there)
SEQUENCE = set(script_constant("subgroup_sequence.py", "SECTIONS"))
BUSY_WAIT = set(script_constant("busy_wait.py", "SECTIONS"))


def mapping_env(mapping):
    return {"MPIGPU_TWO_HOSTS_MAP_BY": mapping} if TWO_HOSTS else {}


@pytest.mark.parametrize("mapping", list(SEQUENCE_RUNS))
def test_subgroup_sequence_repeated(mapping):
    # Before the fix: 0 of 5 passed at 2 hosts x 2 ranks bound to cores (hung in group creation)
    out = run_mpi("subgroup_sequence.py", NP, env=mapping_env(mapping), timeout=90,
                  repeat=SEQUENCE_RUNS[mapping])
    # (8 on the ranks outside the subgroup, which skip its two checks; 10 on its members)
    assert passed_counts(out, NP, SEQUENCE) >= 8


@pytest.mark.skipif(not TWO_HOSTS, reason="one host: test_multirank's p2p_groups at 4 ranks is this")
def test_p2p_groups_by_slot():
    out = run_mpi("p2p_groups.py", NP, env=mapping_env("slot"), timeout=240, repeat=2)
    assert passed_counts(out, NP, p2p_groups_behaviours(NP)) >= 40


@pytest.mark.parametrize("mapping", ["slot", "node"])
def test_killed_rank_ends_the_job_within_the_timeout(mapping):
    # rank 1 is killed: by slot on mpirun's host, round-robin on the other host. The watchdog's
    # timeout is 20 s; the job must end within it + 10 s (the launcher usually ends it at once).
    # The ranks report that they started, so a job that died at start-up does not pass.
    if not TWO_HOSTS and mapping == "node":
        pytest.skip("one host: the mapping makes no difference")
    rc, out, took = launch("die", NP, {"TORCH_MPIGPU_TIMEOUT": "20", **mapping_env(mapping)},
                           timeout=120)
    started = set(re.findall(r"\[rank (\d+)\] started at", out))
    assert started == {str(r) for r in range(NP)}, f"ranks that started: {started}\n{out[-3000:]}"
    assert rc != 0, out[-3000:]
    assert "unreachable" not in out
    assert took < 20 + 10 + 15, f"the job took {took:.0f} s to end after rank 1 was killed"


@pytest.mark.parametrize("mpi_abort", ["works", "stuck"])
def test_stalled_rank_is_reported_and_ends_the_job(mpi_abort):
    # stuck: MPI_Abort is a stand-in that never returns (tests/mp/stuck_mpi_abort.c); Open MPI 5
    # across two hosts once left the job running after the watchdog's MPI_Abort (CI,
    # 2026-11-29), so each waiting rank's backstop must exit it and the launcher end the job
    if not TWO_HOSTS and mpi_abort == "works":
        pytest.skip("one host: test_reliability's stalled-rank tests are this, run 3 times")
    env = {"TORCH_MPIGPU_TIMEOUT": "3", **mapping_env("slot")}
    if mpi_abort == "stuck":
        env["LD_PRELOAD"] = str(stuck_mpi_abort_library())
    rc, out, took = launch("abort", NP, env, timeout=120)
    assert rc != 0, out[-3000:]
    assert re.search(r"WATCHDOG \[rank [023]\]: allreduce \(collective #2", out), out[-3000:]
    assert "Ending the job (MPI_Abort)" in out, out[-3000:]
    backstop = re.findall(r"mpigpu \[rank ([023])\]: MPI_Abort did not end this process within "
                          r"10 s; exiting with code 3", out)
    if mpi_abort == "stuck":
        assert "stand-in MPI_Abort(code 3)" in out, out[-3000:]  # the preload took
        assert backstop, out[-3000:]
    else:
        assert not backstop, out[-3000:]
    assert took < 60, f"the job took {took:.0f} s to end"


@functools.cache
def stuck_mpi_abort_library():
    """tests/mp/stuck_mpi_abort.c built into a preloadable library (in a fresh temporary folder:
    every simulated host and srun task sees this machine's /tmp)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc, gcc or $CC): needed to build tests/mp/stuck_mpi_abort.c")
    folder = tempfile.mkdtemp(prefix="mpigpu-stuck-abort-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # when pytest ends
    library = Path(folder) / "libstuck_mpi_abort.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(MP_DIR / "stuck_mpi_abort.c")],
                   check=True)
    return library


@pytest.mark.parametrize("crowded", ["as launched", "crowded"])
def test_a_waiting_rank_polls_on_one_thread(crowded):
    # rank 0 waits 1 s for late peers, inline and on the worker, sync and async, collective and
    # point-to-point; its threads together may use at most 1.2x its busiest thread's CPU time.
    # Crowded (more ranks than cores: TORCH_MPIGPU_MPI_YIELD=1 says so on any host), at most a
    # quarter of the wait.
    env = {"MPIGPU_TEST_DELAY_S": "1", "TORCH_MPIGPU_INLINE_BYTES": "1024",
           **mapping_env("slot")}
    if crowded == "crowded":
        env["TORCH_MPIGPU_MPI_YIELD"] = "1"
    np = NP if TWO_HOSTS else 2
    out = run_mpi("busy_wait.py", np, env=env, timeout=180, repeat=1)
    assert passed_counts(out, np, BUSY_WAIT) >= len(BUSY_WAIT)
    print("\n".join(line for line in out.splitlines() if "threads' CPU" in line))
