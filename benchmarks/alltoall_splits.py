"""all_to_all_single with split sizes given (MPI_Alltoallv underneath, the MoE pattern), through
mpigpu and as raw MPI_Alltoallv (mpi4py) on the same buffers in the same job.

    mpirun -np 2 python benchmarks/alltoall_splits.py

Equal splits, passed explicitly so the call takes the split-size path; int32; each point the
median of 60 calls after 10 warm-up calls, a barrier before each; rank 0 prints.
(Even all_to_all_single without splits: `python -m torch_mpi_gpu.bench --ops alltoall`.)"""

import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import torch_mpi_gpu  # noqa: F401  (registers the backend)


def median_us(comm, call):
    for _ in range(10):
        call()
    times = []
    for _ in range(60):
        comm.Barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def main():
    dist.init_process_group("mpigpu")
    comm = MPI.COMM_WORLD
    world, rank = comm.size, comm.rank
    if rank == 0:
        print(f"all_to_all_single with splits, {world} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print(f"{'bytes':>10} {'mpigpu us':>10} {'raw Alltoallv us':>17} {'ratio':>6}")
    for nbytes in [32 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20]:
        block = nbytes // 4 // world
        n = block * world
        x = torch.arange(n, dtype=torch.int32) + rank * n
        y = torch.empty(n, dtype=torch.int32)
        splits = [block] * world
        ours = median_us(comm, lambda: dist.all_to_all_single(y, x, splits, splits))
        expected = torch.cat([torch.arange(rank * block, (rank + 1) * block, dtype=torch.int32)
                              + src * n for src in range(world)])
        if not torch.equal(y, expected):
            raise SystemExit(f"[rank {rank}] all_to_all_single at {nbytes} bytes: wrong result")
        displs = [i * block for i in range(world)]
        raw = median_us(comm, lambda: comm.Alltoallv([x.numpy(), splits, displs, MPI.INT],
                                                     [y.numpy(), splits, displs, MPI.INT]))
        if rank == 0:
            print(f"{nbytes:>10} {ours:>10.1f} {raw:>17.1f} {ours / raw:>6.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
