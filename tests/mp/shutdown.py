"""Ending a group while an op can never finish (rank 1 skips a collective rank 0 issued async),
with TORCH_MPIGPU_TIMEOUT_ACTION=report so the watchdog does not end the job. Run by
test_reliability.py at 2 ranks, which checks how each returns and how the job ends. Modes:
  destroy  rank 0 calls destroy_process_group(): it runs the queue first, and must give up after
           the group's timeout (before the fix it waited with a one-year limit), failing the op
  abort    rank 0 calls torch's _abort_process_group(): returns at once, the op fails, later ops
           on the group are refused
In both the stuck MPI call cannot be interrupted, so at exit rank 0 ends the job (MPI_Abort)
instead of hanging in MPI_Finalize.
A second argument `cuda` runs the same on CUDA tensors (the op then sits on the group's CUDA
streams, which abort must release too)."""

import sys
import time

import torch
import torch.distributed as dist

import torch_mpi_gpu

mode = sys.argv[1]
device = torch.device(sys.argv[2] if len(sys.argv) > 2 else "cpu")
if device.type == "cuda":
    torch_mpi_gpu.select_cuda_device()
dist.init_process_group("mpigpu")
rank = dist.get_rank()
dist.barrier()
if rank == 0:
    stuck = dist.all_reduce(torch.ones(1 << 10, device=device), async_op=True)  # rank 1 never joins
    time.sleep(0.5)
    backend = dist.group.WORLD._get_backend(device)
    start = time.monotonic()
    if mode == "destroy":
        dist.destroy_process_group()
    else:
        dist.distributed_c10d._abort_process_group()
    took = time.monotonic() - start
    print(f"rank 0: {mode} returned after {took:.1f} s", flush=True)
    try:
        stuck.wait()
        if device.type == "cuda":
            torch.cuda.synchronize()  # a stream left waiting on the failed op would hang here
        print("rank 0: STUCK OP COMPLETED", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"rank 0: the stuck op failed: {e}", flush=True)
    try:
        backend.allreduce([torch.ones(2, device=device)]).wait()
        print("rank 0: OP AFTER END RAN", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"rank 0: an op after the end is refused: {e}", flush=True)
else:
    time.sleep(8)  # long enough for rank 0 to finish ending its group
    print("rank 1: leaving without the collective", flush=True)
