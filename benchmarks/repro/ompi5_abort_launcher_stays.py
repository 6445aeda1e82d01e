"""Reproduces Open MPI 5.0's launcher staying after an MPI_Abort across two hosts, every rank gone.

Reproducer (plain mpi4py, no mpigpu) of Open MPI 5.0's launcher staying after an MPI_Abort
across two hosts with every rank gone: prterun and the other host's prted wait in their event
loops (gdb), and the job never ends.

Two simulated hosts x 2 ranks filled by slot (ranks 0-1 on h0, 2-3 on h1), bound to cores as a
plain hostfile binds them; the machine busy with processes of the idle scheduling class (as CI's
background setups):

  scripts/two_hosts.sh up names
  for i in 1 2; do chrt --idle 0 sh -c 'while :; do :; done' & done
  python benchmarks/repro/ompi5_abort_launcher_stays.py --runs 40 [--all]

Rank 1 sleeps; rank 0 calls MPI_Abort 3 s after a barrier while ranks 2 and 3 wait in an
allreduce (--all: ranks 0, 2 and 3 call MPI_Abort together, as mpigpu's watchdogs on the waiting
ranks do). A run whose launcher has not ended 30 s later counts as staying.

Measured 2026-12-03 on the 2-core VM, PyPI's Open MPI 5.0.11: rank 0 alone, 3 of 40 runs stayed
beside two idle-class busy loops and 0 of 40 on a quiet machine; --all, 2 of 30 beside the
loops. Rank 2 (on h1) meets rank 0's closed socket and ends itself too (MPI_ERRORS_ARE_FATAL
"Socket closed ... on a NULL communicator"), so two aborts race in every run.
"""

import argparse
import os
from pathlib import Path
import subprocess
import sys
import time

ROOT = Path(__file__).resolve().parents[3]


def rank_main(every_waiting_rank_aborts):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    world.Barrier()
    if world.rank == 1:
        time.sleep(600)  # the stalled rank
    if world.rank == 0 or every_waiting_rank_aborts:
        time.sleep(3)
        world.Abort(3)
    world.allreduce(1)  # waits for rank 1 forever


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--all", action="store_true", help="ranks 0, 2 and 3 call MPI_Abort")
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_main:
        return rank_main(args.all)
    env = dict(os.environ, MPIGPU_TWO_HOSTS_MAP_BY="slot", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [str(ROOT / "scripts" / "two_hosts.sh"), "mpirun", "-np", "4", sys.executable, __file__,
           "--rank-main"] + (["--all"] if args.all else [])
    stayed = 0
    for run in range(args.runs):
        start = time.monotonic()
        with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) as proc:
            try:
                rc = proc.wait(timeout=30)
                print(f"run {run + 1}: exit {rc} after {time.monotonic() - start:.1f} s", flush=True)
            except subprocess.TimeoutExpired:
                stayed += 1
                print(f"run {run + 1}: the launcher stayed (30 s)", flush=True)
                proc.terminate()
                proc.wait()
    print(f"{stayed} of {args.runs} runs: the launcher stayed")


if __name__ == "__main__":
    main()
