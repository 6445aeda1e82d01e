"""Exits the way users exit (no os._exit): run by test_reliability.py, which checks how the job
ends. Modes:
  raise-in-collective  rank 1 raises while the others wait in all_reduce: the job must end within
                       seconds (traceback printed, then MPI_Abort), not hang in MPI_Finalize
  raise-at-start       rank 1 raises right after init while the others enter a barrier
  pending-async        every rank issues async all_reduces and exits without waiting: the queue is
                       run in order at exit, then MPI finalises cleanly (exit 0)
  clean                a normal exit after work: finalises cleanly (exit 0)
"""

import atexit
import sys

import torch
import torch.distributed as dist

pending = []  # pending-async: the tensors of the ops left unwaited


@atexit.register  # before torch_mpi_gpu's own exit hook, so it runs after it (exit hooks: LIFO)
def queued_ops_ran():
    if pending:
        want = float(sum(range(world)))
        right = sum(bool((t == want).all()) for t in pending)
        print(f"rank {rank}: after exit, {right} of {len(pending)} queued ops ran "
              f"with the right result", flush=True)


import torch_mpi_gpu  # noqa: E402,F401

mode = sys.argv[1]
dist.init_process_group("mpigpu")
rank, world = dist.get_rank(), dist.get_world_size()

if mode == "raise-in-collective":
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.all_reduce(t)  # waits for rank 1 forever unless the job is ended
    print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode == "raise-at-start":
    if rank == 1:
        raise ValueError("rank 1 fails on purpose at start-up")
    dist.barrier()
    print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode == "pending-async":
    # large enough to be in flight on the worker when the script ends
    pending += [torch.full((1 << 18,), float(rank)) for _ in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in pending]
    print(f"rank {rank}: exiting with {len(works)} async ops unwaited", flush=True)
elif mode == "clean":
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == world
    dist.destroy_process_group()
    print(f"rank {rank}: clean exit", flush=True)
