"""Ranks waiting on a crowded host (more ranks than cores): do they leave the cores to the ranks
they wait for? Launches itself under the MPI on PATH, at each rank count, once with
TORCH_MPIGPU_MPI_YIELD=1 (waits test and sleep: mpi/Wait.hpp) and once with =0 (MPI's blocking
calls, which spin), and prints a table with the ratios.

    python benchmarks/crowded_waits.py [--ranks 3 4] [--steps 5] [--work-s 0.5] [--iters 300]
                                       [--idle-load N]

  --idle-load N  N busy loops of the idle scheduling class (chrt --idle) run meanwhile, as CI's
                 background setups do: they take only CPU that no other process wants, but a
                 rank that yields may hand them its core until the next tick.

  uneven work   STEPS rounds in which ranks 0 and 1 compute WORK_S of CPU (a Python loop, one
                thread) and every rank then meets in dist.barrier(): wall time of the rounds.
                Ideal: STEPS x WORK_S, when the waiting ranks leave the cores to the two at work.
  barrier       the mean of ITERS back-to-back dist.barrier() calls (us): what sleeping
                costs when nobody is behind.
  waiting CPU   CPU seconds rank 2 used while it waited through the uneven rounds.
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rank_main(steps, work_s, iters):
    import torch.distributed as dist

    import torch_mpi_gpu  # noqa: F401

    dist.init_process_group("mpigpu")
    rank = dist.get_rank()
    dist.barrier()
    start, cpu0 = time.perf_counter(), cpu_s()
    for _ in range(steps):
        if rank < 2:
            t = time.process_time()
            while time.process_time() - t < work_s:
                sum(range(10000))
        dist.barrier()
    uneven, waiting_cpu = time.perf_counter() - start, cpu_s() - cpu0
    for _ in range(50):
        dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.barrier()
    barrier_us = (time.perf_counter() - start) / iters * 1e6
    if rank == 2:
        print(f"RESULT {uneven:.3f} {barrier_us:.1f} {waiting_cpu:.3f}", flush=True)
    dist.destroy_process_group()


def launch(np, crowded, args):
    launcher = shutil.which("mpirun") or shutil.which("mpiexec")
    if launcher is None:
        sys.exit("no mpirun or mpiexec on PATH")
    hydra = "HYDRA" in subprocess.run([launcher, "--version"], capture_output=True,
                                      text=True).stdout.upper()
    env = dict(os.environ, TORCH_MPIGPU_MPI_YIELD="1" if crowded else "0", OMP_NUM_THREADS="1")
    cmd = [launcher, "-n", str(np)] + ([] if hydra else ["--oversubscribe"])
    if not hydra and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, __file__, "--rank-main", "--steps", str(args.steps), "--work-s",
            str(args.work_s), "--iters", str(args.iters)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")), None)
    if out.returncode != 0 or line is None:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return [float(x) for x in line.split()[1:]]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[3, 4])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--work-s", type=float, default=0.5)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--idle-load", type=int, default=0, metavar="N")
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_main:
        return rank_main(args.steps, args.work_s, args.iters)
    if min(args.ranks) < 3:
        sys.exit("--ranks: 3 or more (ranks 0 and 1 work, rank 2 reports)")
    loops = [subprocess.Popen(["chrt", "--idle", "0", "sh", "-c", "while :; do :; done"])
             for _ in range(args.idle_load)]
    try:
        measure(args)
    finally:
        for loop in loops:
            loop.kill()


def measure(args):
    print(f"{os.cpu_count()} cores; uneven work: {args.steps} rounds of {args.work_s} s on ranks 0 "
          f"and 1 (ideal {args.steps * args.work_s:.2f} s); {args.idle_load} idle-class busy "
          f"loop(s) beside")
    print("ranks | uneven work, sleeping / spinning (s) | ratio | barrier, sleeping / spinning (us)"
          " | ratio | rank 2's CPU while waiting, sleeping / spinning (s)")
    for np in args.ranks:
        slept, spun = launch(np, True, args), launch(np, False, args)
        print(f"{np} | {slept[0]:.2f} / {spun[0]:.2f} | {spun[0] / slept[0]:.2f}x | "
              f"{slept[1]:.0f} / {spun[1]:.0f} | {spun[1] / slept[1]:.2f}x | "
              f"{slept[2]:.2f} / {spun[2]:.2f}", flush=True)


if __name__ == "__main__":
    main()
