"""An MPI error inside a collective, at 2 ranks: rank 0 sends rank 1 two elements in
all_to_all_single where rank 1 expects one, so MPI_Alltoallv fails on rank 1 with
MPI_ERR_TRUNCATE (our communicators return errors instead of aborting; MPICH reports it as
MPI_ERR_IN_STATUS). Rank 1 must get a
DistBackendError naming the op, the MPI error and which op of which group it was."""

import torch
import torch.distributed as dist

from common import Checker, run


def main():
    dist.init_process_group("mpigpu")
    rank = dist.get_rank()
    c = Checker("MPI error inside a collective")
    dist.all_reduce(torch.ones(1))  # collective #1; the failing one is #2
    out = torch.empty(2)
    if rank == 0:
        dist.all_to_all_single(out, torch.arange(3.0), output_split_sizes=[1, 1],
                               input_split_sizes=[1, 2])
        # its own first element, and rank 1's first (rank 1 sends one element to each)
        c.close("sender unaffected: its result", out, torch.tensor([0.0, 0.0]))
    else:
        c.raises("truncated all_to_all_single", dist.DistBackendError,
                 lambda: dist.all_to_all_single(out, torch.arange(2.0), output_split_sizes=[1, 1],
                                                input_split_sizes=[1, 1]),
                 # MPI's own text differs: Open MPI says MPI_ERR_TRUNCATE, MPICH points to the
                 # status ("See the MPI_ERROR field in MPI_Status")
                 must_contain=("all_to_all_single [rank 1]", "MPI_Alltoallv", "failed",
                               "collective #2 of group '0'", "world rank 1"))
    return c.finish()


if __name__ == "__main__":
    run(main)
