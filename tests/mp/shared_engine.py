"""Aborting one group when every group shares one MPI thread: MPI granted less than
MPI_THREAD_MULTIPLE (here mpi4py initialises MPI at MPI_THREAD_SERIALIZED first, through
common.py and MPIGPU_TEST_THREAD_LEVEL). Run by
test_reliability.py at 2 ranks, with TORCH_MPIGPU_TIMEOUT_ACTION=report. Modes:
  others-go-on  rank 0 aborts group A while A has a receive pending (rank 1 never sends) and a
                collective queued behind group B's running collective (rank 1 joins it late).
                A's ops fail at once, B's running op completes, B's later ops run (before the
                fix B's ops failed with A's abort), and the job ends cleanly.
  blocked       A's collective is inside MPI (rank 1 never joins) when rank 0 aborts A. No other
                thread may enter MPI meanwhile, so B's ops fail, saying what blocks them; at exit
                rank 0 ends the job with MPI_Abort instead of hanging in MPI_Finalize."""

import sys
import time

from common import THREAD_LEVEL  # first: initialises MPI at MPIGPU_TEST_THREAD_LEVEL, checks it

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_mpi_gpu  # noqa: E402

mode = sys.argv[1]
if THREAD_LEVEL != "serialized":  # the shared engine would not be tested at all
    raise RuntimeError("run with MPIGPU_TEST_THREAD_LEVEL=serialized")
level = torch_mpi_gpu._C.mpi_info()["thread_level"]
dist.init_process_group("mpigpu")
rank = dist.get_rank()
group_a = dist.new_group([0, 1])
group_b = dist.new_group([0, 1])
dist.barrier()
print(f"rank {rank}: {level}, groups '{group_a.group_name}' (A) and '{group_b.group_name}' (B)",
      flush=True)


def outcome(name, work):
    try:
        work.wait()
        print(f"rank 0: {name} COMPLETED", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"rank 0: {name} failed: {e}", flush=True)


def b_allreduce(value):
    t = torch.full((4,), float(value))
    dist.all_reduce(t, group=group_b)
    return t[0].item()


if mode == "others-go-on":
    if rank == 0:
        pending = dist.irecv(torch.zeros(8), src=1, group=group_a)  # rank 1 never sends
        b_running = torch.ones(4)
        b_work = dist.all_reduce(b_running, group=group_b, async_op=True)  # rank 1 joins late
        time.sleep(0.3)  # the shared worker is now inside B's collective
        queued = dist.all_reduce(torch.ones(4), group=group_a, async_op=True)  # behind B's op
        start = time.monotonic()
        dist.distributed_c10d._abort_process_group(group_a)
        print(f"rank 0: abort returned after {time.monotonic() - start:.1f} s", flush=True)
        outcome("A's queued collective", queued)
        outcome("A's pending receive", pending)
        b_work.wait()
        print(f"rank 0: B's running collective gave {b_running[0].item():.0f}", flush=True)
        print(f"rank 0: B's next collective gave {b_allreduce(3):.0f}", flush=True)
    else:
        time.sleep(2)  # rank 0 aborts A meanwhile
        dist.all_reduce(torch.ones(4), group=group_b)
        b_allreduce(3)
    dist.destroy_process_group()
    print(f"rank {rank}: clean end", flush=True)
elif mode == "blocked":
    if rank == 0:
        stuck = dist.all_reduce(torch.ones(4), group=group_a, async_op=True)  # rank 1 never joins
        b_queued = dist.all_reduce(torch.ones(4), group=group_b, async_op=True)  # behind it
        time.sleep(0.5)
        start = time.monotonic()
        dist.distributed_c10d._abort_process_group(group_a)
        print(f"rank 0: abort returned after {time.monotonic() - start:.1f} s", flush=True)
        outcome("A's stuck collective", stuck)
        outcome("B's queued collective", b_queued)
        outcome("B's next collective", dist.all_reduce(torch.ones(4), group=group_b, async_op=True))
    else:
        time.sleep(6)
        print("rank 1: leaving without A's collective", flush=True)
else:
    raise SystemExit(f"unknown mode {mode}")
