"""The node's leader failing an op while it works on its peers' mapped tensors
(TORCH_MPIGPU_NODE_LEADER=mapped; TORCH_MPIGPU_TEST_LEADER_FAILS_AT=2 makes its second such op
fail, as a failed kernel would): every rank raises for that op, the leader its own error and each
peer one that names the op, itself and the leader, and none waits for a leader that will not
come; the ops before and after it are right (values every rank computes), so the group goes on.
Run under mpirun on one node, with the device-slot code on host memory (CPU CI) or CUDA IPC."""

import torch
import torch.distributed as dist
from torch.distributed import DistBackendError

import torch_mpi_gpu
from common import Checker, run, use_test_device


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    use_test_device()
    c = Checker(f"mapped_leader_fails(np={world})")
    c.section("the leader fails a mapped op")
    want = float(sum(range(1, world + 1)))
    for i, fails in enumerate((False, True, False)):
        t = torch.full((100,), float(rank + 1))
        if not fails:
            dist.all_reduce(t)
            c.true(f"all_reduce #{i} right", bool(t.eq(want).all()), str(t[:3].tolist()))
            continue
        expect = (("TORCH_MPIGPU_TEST_LEADER_FAILS_AT",) if rank == 0 else
                  ("allreduce", f"[rank {rank}]", "the node's leader (local rank 0) failed in this op",
                   "TORCH_MPIGPU_TEST_LEADER_FAILS_AT"))
        c.raises(f"all_reduce #{i}: every rank raises, the peers naming the leader", DistBackendError,
                 lambda: dist.all_reduce(t), expect)
    counted = torch_mpi_gpu._C.node_waits()
    c.true("the two good ops were mapped, none refused",
           counted["mapped_ops"] == 2 and counted["mapped_refused"] == 0, str(counted))
    dist.destroy_process_group()
    return c.finish()


if __name__ == "__main__":
    run(main)
