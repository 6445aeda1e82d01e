"""A rank that stalls: the watchdog must report the op on the waiting ranks after the timeout
(TORCH_MPIGPU_TIMEOUT), then end the job (default) or only report. Modes (argv[1]):
  abort        rank 1 never joins a blocking all_reduce; the job must end with the report
  abort-async  the same with async_op=True and wait() (the op runs on the group's worker)
  report       rank 1 joins 4 s late with TORCH_MPIGPU_TIMEOUT_ACTION=report: reported, then
               finishes correctly
  die          rank 1 is killed (SIGKILL) while the others are in an all_reduce: the launcher
               must end the job; nobody waits for the timeout
  wait-timeout rank 1 joins 5 s late, TORCH_MPIGPU_TIMEOUT=2 with TIMEOUT_ACTION=report: the
               others' Work.wait() raises after the group's 2 s naming the op and rank, the op
               keeps running, and a second wait() returns its right result"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import torch_mpi_gpu

from common import Checker, run


def main():
    mode = sys.argv[1]
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"stall({mode}, np={world})")
    t = torch.ones(16)
    dist.all_reduce(t)  # everyone is up
    runs = torch_mpi_gpu._C.algorithm_runs()
    print(f"[rank {rank}] started at {time.time():.3f} (node algorithm runs: {runs['node']})",
          flush=True)
    if mode == "die":
        if rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(1 << 20))
        c.true("unreachable: the job should have been ended", False)
    elif mode in ("abort", "abort-async"):
        if rank == 1:
            time.sleep(600)  # the stalled rank: never reaches the op
        elif mode == "abort":
            dist.all_reduce(t)
        else:
            dist.all_reduce(t, async_op=True).wait(timeout=__import__("datetime").timedelta(hours=1))
        c.true("unreachable: the job should have been ended", False)
    elif mode == "wait-timeout":
        if rank == 1:
            time.sleep(5)
            dist.all_reduce(t)
        else:
            w = dist.all_reduce(t, async_op=True)
            start = time.monotonic()
            c.raises("wait() past the group's timeout", dist.DistBackendError, w.wait,
                     must_contain=(f"allreduce [rank {rank}]", "collective #2", "did not complete "
                                   "within 2000 ms"))
            c.true("raised at the timeout", 1.5 < time.monotonic() - start < 4.5,
                   f"after {time.monotonic() - start:.1f} s")
            w.wait(timeout=__import__("datetime").timedelta(seconds=60))
        c.close("the late op's result", t, torch.full((16,), float(world * world)))
    else:
        if rank == 1:
            time.sleep(4)
        dist.all_reduce(t)
        c.close("late all_reduce result", t, torch.full((16,), float(world * world)))
    return c.finish()


if __name__ == "__main__":
    run(main)
