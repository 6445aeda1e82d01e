"""Stalled ranks: the watchdog reports the op after the timeout and ends the job (or only reports
with TORCH_MPIGPU_TIMEOUT_ACTION=report). Launched directly (these jobs are meant to fail)."""

import os
import re
from pathlib import Path
import signal
import subprocess
import sys
import threading
import time

import pytest

import conftest
from conftest import LAUNCHER, MP_DIR, SERIALIZED, launch_command, launch_env, rank_command, run_mpi
from conftest import SRUN_MPI, is_hydra, mpirun_path, passed_counts, run_launcher


def launch(mode, np, env, script="stall.py", timeout=120, args=()):
    full_env = launch_env(env)
    cmd = launch_command(np, dict(env))
    cmd += rank_command(script, mode, *args)
    try:
        proc = run_launcher(cmd, full_env, timeout)
    except subprocess.TimeoutExpired as e:
        out, err = e.stdout or "", e.stderr or ""
        pytest.fail(f"{script} {mode} at {np} ranks still running after {timeout} s (hang):\n"
                    f"{out[-3000:]}\nstderr:\n{err[-3000:]}")
    return proc.returncode, proc.stdout + proc.stderr, proc.seconds


# Hang-prone jobs (a stalled rank, a shared MPI thread aborted) run this often under every
# launcher (#26): an intermittent hang or race shows as a failing run, named.
HANG_PRONE_RUNS = 3


def launch_runs(mode, np, env, **kwargs):
    """launch() HANG_PRONE_RUNS times; yields (run label, exit status, output, seconds)."""
    for run in range(HANG_PRONE_RUNS):
        yield (f"run {run + 1} of {HANG_PRONE_RUNS}", *launch(mode, np, env, **kwargs))


def test_a_job_lingering_after_its_ranks_ended_is_ended_and_run_once_more(monkeypatch):
    # tests/conftest.py's guard against Open MPI 5's prterun outliving its ranks, shown to act: a
    # stand-in launcher (a shell) whose one rank ends at once and which then sleeps on is ended
    # and run once more; the second time fails the test.
    monkeypatch.setattr(conftest, "LAUNCHER_OUTLIVES_RANKS_S", 1)
    noted = len(conftest._launches_run_again)
    cmd = ["sh", "-c", '"$0" "$1" no_such_script.py; exec sleep 60', sys.executable,
           str(MP_DIR / "start.py")]
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="twice in a row every rank had ended 1 s before"):
        run_launcher(cmd, launch_env(), timeout=50)
    assert time.monotonic() - start < 30
    assert len(conftest._launches_run_again) == noted + 2
    del conftest._launches_run_again[noted:]  # not the suite's to report


# A rank's report of the crash, as srun forwarded it in CI (2026-12-04), shortened
OPEN_MPI_INIT_RACE_REPORT = """\
[h0:18841] *** Process received signal ***
[h0:18841] Signal: Segmentation fault (11)
[h0:18841] Failing at address: 0xe0
[h0:18841] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7f040de5a050]
[h0:18841] [ 1] /v/lib/libmpi.so.40(mca_pml_ob1_recv_frag_callback_match+0x95)[0x7f03eea78f25]
[h0:18841] [ 2] /v/lib/libopen-pal.so.80(+0xdba28)[0x7f03ee79ca28]
[h0:18841] [ 8] /v/lib/libopen-pal.so.80(opal_progress+0x84)[0x7f03ee6e7ab4]
[h0:18841] [ 9] /v/lib/libmpi.so.40(ompi_mpi_init+0x425)[0x7f03ee891215]
[h0:18841] [10] /v/lib/libmpi.so.40(PMPI_Init_thread+0xbf)[0x7f03ee8c089f]
[h0:18841] *** End of error message ***
srun: error: h0: task 0: Segmentation fault
"""


def test_a_rank_killed_by_open_mpi_init_race_runs_the_launch_again_once(tmp_path):
    # tests/conftest.py's guard against Open MPI 5's start-up race under srun, shown to act only
    # on that crash: a stand-in launcher printing the report above and failing runs twice, then
    # fails the test; the same crash outside MPI_Init (another process's stack) fails at once.
    noted = len(conftest._launches_run_again)
    race = ["sh", "-c", 'printf %s "$0"; exit 139', OPEN_MPI_INIT_RACE_REPORT]
    with pytest.raises(pytest.fail.Exception, match="twice in a row a rank died of Open MPI 5's"):
        run_launcher(race, launch_env(), timeout=50)
    assert len(conftest._launches_run_again) == noted + 2
    del conftest._launches_run_again[noted:]  # not the suite's to report
    elsewhere = OPEN_MPI_INIT_RACE_REPORT.replace("[h0:18841] [ 9]", "[h0:18842] [ 9]")
    assert not conftest.died_in_open_mpi_init_race(elsewhere)
    done = run_launcher(["sh", "-c", 'printf %s "$0"; exit 139', elsewhere], launch_env(), timeout=50)
    assert done.returncode == 139 and len(conftest._launches_run_again) == noted
    # a background job (RunningJob) starts once more, and its second start is the one used
    job = RunningJob.__new__(RunningJob)
    job.np, job.env = 2, launch_env()
    job.cmd = ["sh", "-c", 'if [ -e "$1" ]; then echo "rank 0 pid 11 waiting"; '
               'echo "rank 1 pid 12 waiting"; else touch "$1"; printf %s "$0"; exit 139; fi',
               OPEN_MPI_INIT_RACE_REPORT, str(tmp_path / "started once")]
    job.start()
    assert job.pids() == [11, 12]
    assert len(conftest._launches_run_again) == noted + 1
    del conftest._launches_run_again[noted:]


@pytest.mark.parametrize("mode", ["abort", "abort-async"])
def test_stalled_rank_is_reported_and_ends_the_job(mode):
    for run, rc, out, took in launch_runs(mode, 3, {"TORCH_MPIGPU_TIMEOUT": "2"}):
        check_stalled_rank_report(run, rc, out, took)


def check_stalled_rank_report(run, rc, out, took):
    assert rc != 0, f"{run}: exit 0\n{out[-3000:]}"
    # a waiting rank names the op, its sequence number, its group and the timeout (the first
    # to report ends the job, so the other waiting rank may not get to print); the stalled
    # rank has nothing in flight
    assert re.search(r"WATCHDOG \[rank [02]\]: allreduce \(collective #2 of group '\S+', 64 bytes", out), \
        out[-3000:]
    assert "WATCHDOG [rank 1]" not in out
    # and it names the rank that never issued the collective (from the progress in the store)
    assert "Ranks that had not issued collective #2 at their last report" in out, out[-3000:]
    assert "1 (has issued 1)" in out, out[-3000:]
    assert "past its timeout of 2 s" in out and "Ending the job (MPI_Abort)" in out, out[-3000:]
    assert "unreachable" not in out
    assert took < 60, f"the job took {took:.0f} s to end"


def test_report_only_lets_a_late_rank_finish():
    out = run_mpi("stall.py", 2, env={"TORCH_MPIGPU_TIMEOUT": "2",
                                      "TORCH_MPIGPU_TIMEOUT_ACTION": "report"}, args=("report",))
    assert "WATCHDOG [rank 0]: allreduce" in out and "the op keeps waiting" in out, out[-3000:]
    assert passed_counts(out, 2) >= 1


def test_wait_raises_after_the_groups_timeout_naming_the_op():
    out = run_mpi("stall.py", 3, env={"TORCH_MPIGPU_TIMEOUT": "2",
                                      "TORCH_MPIGPU_TIMEOUT_ACTION": "report"},
                  args=("wait-timeout",), timeout=120)
    # ranks 0 and 2: the raise, its timing and the result; rank 1: the result
    assert passed_counts(out, 3) >= 1
    for rank, checks in ((0, 3), (1, 1), (2, 3)):
        assert f"[rank {rank}/3] stall(wait-timeout, np=3): {checks} checks passed, 0 failed" \
            in out, out[-3000:]


def test_killed_rank_ends_the_job():
    # Default timeout (30 min): the launcher must end it. srun --mpi=pmi2 (MPICH) does not notice
    # a task killed by a signal unless told to (--kill-on-bad-exit, as the README says); the
    # others would wait until the watchdog's timeout.
    env = {"SLURM_KILL_BAD_EXIT": "1"} if SRUN_MPI == "pmi2" else {}
    shm_before = set(Path("/dev/shm").glob("mpigpu-*"))
    rc, out, took = launch("die", 3, env)
    # the others were waiting in the node algorithm's shared memory: its name was unlinked when
    # the group made it, so nothing of ours is left behind
    left = set(Path("/dev/shm").glob("mpigpu-*")) - shm_before
    assert not left, f"shared-memory segments left after the job: {left}"
    if not LAUNCHER.startswith("two-hosts"):  # (3 ranks on two hosts: no node algorithm)
        assert "node algorithm runs: 0" not in out, out[-3000:]
    # every rank started (a crash at start-up is no test of a killed rank), and the job ended
    started = set(re.findall(r"\[rank (\d+)\] started at", out))
    assert started == {"0", "1", "2"}, f"ranks that started: {started}\n{out[-3000:]}"
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


@pytest.mark.parametrize("mode, np", [("exit-in-collective", 2), ("exit-in-collective", 3),
                                      ("return-in-collective", 3), ("exit-in-subgroup", 4),
                                      ("exit-before-send", 3), ("destroy-in-collective", 3),
                                      ("host-destroys-in-collective", 3)])
def test_a_rank_leaving_early_ends_the_job(mode, np):
    # One rank leaves (sys.exit, the end of its script, destroy_process_group) while the others
    # wait for it in a collective it never issued, or in a receive from it. Before the departure
    # notice the job hung until the group's timeout (30 minutes by default; the launch's limit
    # here is 60 s); gloo's peers see the leaver's sockets close.
    rc, out, took = launch(mode, np, {}, script="exits.py", timeout=60)
    leaver = np - 2 if mode == "exit-in-subgroup" else 0 if mode.startswith("host") else 1
    want = f"rank {leaver} left the group after issuing 1 collective(s) in it: it exited"
    if "destroy" in mode:
        want = f"rank {leaver} left the group after issuing 2 collective(s) in it: " + \
            "it called destroy_process_group"
    if mode == "exit-before-send":
        want = "recv (point-to-point op #1 with rank 1 of group '0', 16 bytes on this rank) " + \
            "can never finish: " + want
    assert rc != 0, out[-3000:]
    assert "can never finish" in out and want in out, f"wanted: {want}\n{out[-3000:]}"
    assert "MPI_Abort" in out and "UNREACHABLE" not in out, out[-3000:]
    assert took < 30, f"the job took {took:.0f} s to end"


def test_a_receive_never_waited_for_from_a_rank_that_left_ends_cleanly():
    # Only a send or receive someone waits for is judged: one posted and abandoned is no hang.
    rc, out, _ = launch("unwaited-receive", 2, {}, script="exits.py", timeout=60)
    assert rc == 0 and out.count("clean end with a receive never waited for") == 2, out[-3000:]
    assert "can never finish" not in out, out[-3000:]


def test_a_staggered_normal_end_meets_no_closed_store():
    # Rank 0 (the store's host) ends first; the others' departure notices at exit still find its
    # store, because it waits in MPI_Finalize for them (a notice after MPI_Finalize would not;
    # torch logs each failed store request with a stack trace).
    rc, out, _ = launch("staggered-end", 3, {}, script="exits.py", timeout=60)
    assert rc == 0 and out.count("staggered end") == 3, out[-3000:]
    for sign in ("Broken pipe", "Connection was likely closed", "can never finish"):
        assert sign not in out, out[-3000:]


def test_a_staggered_destroy_meets_no_closed_store():
    # Rank 0 hosts torch's TCP store (chosen by its port; the MPI store has no server to close)
    # and destroys its groups first, staying alive: the store is held until every member has said
    # it left (before, the store closed with rank 0's destroy, and every later notice met a
    # closed store).
    from helpers import free_port
    rc, out, _ = launch("staggered-destroy", 3, {"TORCH_MPIGPU_MASTER_PORT": str(free_port())},
                        script="exits.py", timeout=60)
    assert rc == 0 and out.count("staggered destroy") == 3, out[-3000:]
    for sign in ("Broken pipe", "Connection was likely closed", "can never finish",
                 "still listens"):
        assert sign not in out, out[-3000:]


class RunningJob:
    """exits.py `mode` at `np` ranks under the test launcher, running in the background: its
    output is gathered as it comes; `pids()` are the ranks' processes (each prints one line
    "rank R pid P waiting" when it is ready for the signal)."""

    def __init__(self, mode, np, env=None, wrap=()):
        self.np = np
        self.cmd = launch_command(np, dict(env or {})) + list(wrap) + rank_command("exits.py", mode)
        self.env = launch_env(env)
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=MP_DIR, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout),
                                       daemon=True)
        self.reader.start()

    def output(self):
        return "".join(self.lines)

    def wait_for(self, count, pattern, timeout=90, or_fail=True):
        """The matches of `pattern` in the output once there are `count`; fails the test if the
        job ends or `timeout` passes first (or_fail=False: returns None)."""
        deadline = time.monotonic() + timeout
        while True:
            ended = self.proc.poll() is not None
            if ended:
                self.reader.join(10)  # what the job wrote before it ended, whole
            found = re.findall(pattern, self.output())
            if len(found) >= count:
                return found
            if ended or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if not or_fail:
            return None
        self.stop()
        pytest.fail(f"{count} lines like {pattern!r} did not come within {timeout} s:\n"
                    f"{self.output()[-3000:]}")

    def stop(self):
        """Ends a job the test gave up on: SIGTERM to the launcher, SIGKILL 10 s later (a SIGKILL
        alone leaves Open MPI's session folder behind, and ranks not yet in a group running)."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def pids(self):
        """The ranks' pids once every rank is ready. A job whose rank died of Open MPI 5's
        start-up race (tests/conftest.py) starts once more, as run_launcher's launches do."""
        ready = r"rank (\d+) pid (\d+) waiting"
        found = self.wait_for(self.np, ready, or_fail=False)
        if found is None:
            if not conftest.died_in_open_mpi_init_race(self.output()):
                self.wait_for(self.np, ready, timeout=0)  # fails the test with the output
            conftest.note_launch_run_again(1, conftest.OPEN_MPI_INIT_RACE)
            self.start()
            found = self.wait_for(self.np, ready)
        return [int(pid) for _, pid in sorted(dict(found).items())]

    def end(self, timeout):
        """(exit status, seconds it took to end); fails naming a hang after `timeout`."""
        start = time.monotonic()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            self.reader.join(10)
            pytest.fail(f"still running {timeout} s after the signal (hang):\n"
                        f"{self.output()[-3000:]}")
        self.reader.join(10)
        return rc, time.monotonic() - start


def gone(pids, timeout=15):
    """The processes of `pids` that are still alive after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists()
                 and "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace")]
    return alive


# A wrapper script around each rank: rank 1's runs the command as a child, the others' `exec` it.
RANK_1_WRAPPED = ("sh", "-c", 'case "${OMPI_COMM_WORLD_RANK:-$PMI_RANK}" in 1) "$@"; exit $?;; '
                  '*) exec "$@";; esac', "wrapper")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_to_the_launcher_ends_a_job_waiting_in_an_op(sig):
    # Ctrl-C at the terminal (SIGINT to the launcher), and SIGTERM (what `timeout`, `kill` or a
    # batch system's end of the job sends it), while rank 1 sleeps in Python, rank 0 waits inside
    # a blocking all_reduce (in MPI) and the others in wait() on an async one: the job must end
    # within seconds, every rank's process with it, and no shared-memory segment of ours left.
    # Open MPI's mpirun and srun end the job themselves; MPICH's mpiexec passes the signal to
    # the ranks, and rank 1's KeyboardInterrupt (or SIGTERM's default action) ends it. srun
    # takes Ctrl-C twice within a second (once only prints the step's state), as users press it.
    # SIGKILL (the OOM killer, a hard kill) leaves nothing to end the job: Hydra's proxies and
    # Open MPI 4.1's ranks see it and end; Open MPI 5's ranks end themselves only inside an MPI
    # call, and these wait in shared memory (the node algorithm) and in Python, so mpigpu's
    # watchdog ends a rank whose launcher has gone (before, all three ran on for ever).
    # Rank 1 runs under a wrapper script that does not `exec` Python (as many sites' do): its
    # launcher is the wrapper's parent.
    if sig == "SIGKILL" and SRUN_MPI:
        pytest.skip("srun: a SIGKILL to srun leaves the step to Slurm, which shows it in squeue "
                    "and ends it with scancel (or at InactiveLimit, where a site sets one)")
    shm_before = set(Path("/dev/shm").glob("mpigpu-*"))
    job = RunningJob("wait-for-a-signal", 3, wrap=RANK_1_WRAPPED if sig == "SIGKILL" else ())
    pids = job.pids()
    if sig == "SIGKILL":
        wrapper = Path(f"/proc/{pids[1]}/stat").read_text().rsplit(")", 1)[1].split()[1]
        assert Path(f"/proc/{wrapper}/comm").read_text().strip() == "sh", "rank 1 is not wrapped"
    time.sleep(1)  # inside the ops, past any start-up
    job.proc.send_signal(getattr(signal, sig))
    if sig == "SIGINT" and SRUN_MPI:
        time.sleep(0.3)
        job.proc.send_signal(signal.SIGINT)
    rc, took = job.end(timeout=60)
    out = job.output()
    assert rc != 0, out[-3000:]
    assert took < 30, f"the job took {took:.0f} s to end after {sig}:\n{out[-3000:]}"
    # (after a SIGKILL, within the watchdog's tick: 15 s is slack for a loaded machine)
    assert not gone(pids), f"rank processes {gone(pids, 0)} outlived the job:\n{out[-3000:]}"
    left = set(Path("/dev/shm").glob("mpigpu-*")) - shm_before
    assert not left, f"shared-memory segments left after the job: {left}"
    assert "UNREACHABLE" not in out, out[-3000:]


def test_every_rank_signalled_with_sigterm_stops_cleanly_in_its_handler():
    # Slurm ends a job (scancel, the time limit, preemption) with SIGTERM to every task, and
    # training programs catch it to stop at a step boundary and save. Each rank is told at its
    # own moment, 50 ms apart, while SIGALRM arrives every 0.5 ms, so signals interrupt MPI calls
    # and mpigpu's waits on every thread: no op may fail or give a wrong element, and the job
    # must end with exit 0, every rank at the same step.
    job = RunningJob("preempted", 3)
    pids = job.pids()
    job.wait_for(3, r"rank \d+: 200 SIGALRMs taken")  # many steps under the SIGALRMs
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.05)
    rc, _ = job.end(timeout=60)
    out = job.output()
    assert rc == 0, out[-3000:]
    stopped = re.findall(r"rank (\d+): stopped at step (\d+) \(every rank's: \[([\d, ]+)\]\) "
                         r"after (\d+) SIGALRMs, (\d+) wrong elements", out)
    assert sorted(r for r, *_ in stopped) == ["0", "1", "2"], out[-3000:]
    for rank, step, steps, alarms, wrong in stopped:
        assert wrong == "0", f"rank {rank}: {wrong} wrong elements\n{out[-3000:]}"
        assert steps.split(", ") == [step] * 3, f"rank {rank}: steps {steps}\n{out[-3000:]}"
        assert int(alarms) >= 200, f"rank {rank}: only {alarms} SIGALRMs arrived\n{out[-3000:]}"
    assert int(stopped[0][1]) > 0, out[-3000:]


def test_abort_on_exception_off_leaves_the_job_to_the_watchdog():
    # TORCH_MPIGPU_ABORT_ON_EXCEPTION=0: no hook of ours, so the raising rank goes on to finalise
    # MPI, which waits for rank 0 inside its barrier (as the README warns); the watchdog's
    # timeout (3 s here) is then what ends the job
    rc, out, took = launch("raise-at-start", 2, {"TORCH_MPIGPU_ABORT_ON_EXCEPTION": "0",
                                                 "TORCH_MPIGPU_TIMEOUT": "3"},
                           script="exits.py", timeout=90)
    assert rc != 0 and "fails on purpose" in out and "Traceback" in out, out[-3000:]
    assert "ending all" not in out, out[-3000:]  # our hook stayed out
    assert "WATCHDOG [rank 0]: barrier" in out, out[-3000:]
    assert took < 60, f"the job took {took:.0f} s to end"


def test_exit_with_async_ops_pending_finishes_cleanly():
    # The queued collectives run in issue order at exit, then MPI finalises; before the fix
    # about half of the runs hung (one rank dropped an op its peer was already inside: our exit
    # path, whichever launcher), so 8 runs under Open MPI's mpirun miss it with odds of 1 in 256,
    # 4 under MPICH's mpiexec (its ranks poll: 4 s a run beside the second lane), and 3 under each
    # other launcher (srun twice, two hosts by IP only: how the job ends there) bring a CI run to
    # 21 runs, 1 in 2 x 10^6 together.
    runs = 3 if LAUNCHER != "mpirun" else 4 if is_hydra(mpirun_path()) else 8
    for i in range(runs):
        rc, out, took = launch("pending-async", 2, {}, script="exits.py", timeout=60)
        assert rc == 0, f"run {i}: exit {rc}\n{out[-3000:]}"
        assert out.count("async ops unwaited") == 2, out[-3000:]
        # and they ran, in order, with the right results (read after the exit hook)
        assert out.count("8 of 8 queued ops ran with the right result") == 2, out[-3000:]


@pytest.mark.parametrize("mode", ["destroy", "abort"])
def test_ending_a_group_with_an_op_that_never_finishes(mode):
    # destroy_process_group() used to wait with a one-year limit; abort() did nothing.
    check_ending_a_group_with_a_stuck_op(mode, "cpu")


def test_shared_mpi_thread_abort_of_one_group_leaves_the_others_working():
    # Below MPI_THREAD_MULTIPLE every group shares one engine; abort() of one group used to stop
    # it, failing every other group's ops.
    for run, rc, out, took in launch_runs(
            "others-go-on", 2, {**SERIALIZED, "TORCH_MPIGPU_TIMEOUT": "30",
                                "TORCH_MPIGPU_TIMEOUT_ACTION": "report"},
            script="shared_engine.py", timeout=90):
        check_others_go_on(run, rc, out, took)


def check_others_go_on(run, rc, out, took):
    assert out.count("MPI_THREAD_SERIALIZED, groups") == 2, f"{run}\n{out[-3000:]}"
    # the ordering rule of a shared MPI thread is said once per process, when it starts to matter
    assert out.count("every process group shares one MPI thread") == 2, out[-3000:]
    returned = re.search(r"rank 0: abort returned after ([\d.]+) s", out)
    assert returned and float(returned.group(1)) < 1, out[-3000:]
    for op in ("A's queued collective", "A's pending receive"):
        assert re.search(rf"{op} failed: mpigpu \w+ \[rank 0\]: .* of group '1' .*"
                         r"was aborted \(the process group's abort\(\)\)", out), out[-3000:]
    assert "COMPLETED" not in out, out[-3000:]
    # B's collective running at the abort, and the one after it: 1+1, and 3+3
    assert "B's running collective gave 2" in out and "B's next collective gave 6" in out, \
        out[-3000:]
    assert rc == 0 and out.count("clean end") == 2, out[-3000:]
    assert took < 60, f"the job took {took:.0f} s to end"


def test_shared_mpi_thread_abort_while_the_group_is_inside_mpi_fails_the_others_saying_why():
    for run, rc, out, took in launch_runs(
            "blocked", 2, {**SERIALIZED, "TORCH_MPIGPU_TIMEOUT": "30",
                           "TORCH_MPIGPU_TIMEOUT_ACTION": "report"},
            script="shared_engine.py", timeout=90):
        check_blocked_abort(run, rc, out, took)


def check_blocked_abort(run, rc, out, took):
    returned = re.search(r"rank 0: abort returned after ([\d.]+) s", out)
    assert returned and float(returned.group(1)) < 1, f"{run}\n{out[-3000:]}"
    assert re.search(r"A's stuck collective failed: .* was aborted .* while inside MPI", out), \
        out[-3000:]
    # queued before the abort: told which op blocks the shared MPI thread; issued after: refused
    assert re.search(r"B's queued collective failed: .* of group '2' .* failed: the one thread "
                     r"that may call MPI here .* is blocked inside collective #1 of group '1'",
                     out), out[-3000:]
    assert re.search(r"B's next collective failed: .* MPI is blocked inside an aborted op of "
                     r"group '1'", out), out[-3000:]
    assert "COMPLETED" not in out, out[-3000:]
    assert rc != 0 and "instead of hanging in MPI_Finalize" in out, out[-3000:]
    assert took < 60, f"the job took {took:.0f} s to end"


def check_ending_a_group_with_a_stuck_op(mode, device):
    """shutdown.py's checks, shared with test_gpu.py (device "cuda")."""
    rc, out, took = launch(mode, 2, {"TORCH_MPIGPU_TIMEOUT": "3",
                                     "TORCH_MPIGPU_TIMEOUT_ACTION": "report"},
                           script="shutdown.py", timeout=90, args=(device,))
    returned = re.search(rf"rank 0: {mode} returned after ([\d.]+) s", out)
    assert returned, out[-3000:]
    limit = 10 if mode == "destroy" else 2  # destroy: the group's timeout (3 s), abort: at once
    assert float(returned.group(1)) < limit, out[-3000:]
    if mode == "destroy":
        assert "did not finish within the timeout (3000 ms); aborting the group" in out
    assert "the stuck op failed: " in out and "STUCK OP COMPLETED" not in out, out[-3000:]
    assert "an op after the end is refused" in out and "destroyed or aborted" in out, out[-3000:]
    # the stuck MPI call cannot be interrupted: the job is ended, not left in MPI_Finalize
    assert rc != 0 and "instead of hanging in MPI_Finalize" in out, out[-3000:]
    assert took < 60, f"the job took {took:.0f} s to end"


def test_clean_exit_finalizes():
    rc, out, took = launch("clean", 3, {}, script="exits.py", timeout=60)
    assert rc == 0 and out.count("clean exit") == 3, out[-3000:]
