"""Fusion: many tensors in one op cost one MPI call per bucket (counted through the backend's MPI
call counter), results match a float64 reference, and TORCH_MPIGPU_FUSION_BYTES sets the bucket
size. Run under mpirun at 1-4 ranks."""

import os

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, make_input, reduced, run, use_test_device


# The sections every rank reports, and the one it reports only with a peer (tests/
# test_multirank.py reads both from here)
(HUNDRED_TENSORS, MIXED_DTYPES, COALESCING_MANAGER, COALESCED_GATHER_SCATTER, FUSION_BYTES,
 FUSE_BELOW_BYTES) = SECTIONS = (
    "100 fp32 tensors of odd sizes in one allreduce", "mixed dtypes", "the coalescing manager",
    "coalesced all_gather_into_tensor / reduce_scatter_tensor",
    "TORCH_MPIGPU_FUSION_BYTES caps a bucket",
    "TORCH_MPIGPU_FUSE_BELOW_BYTES leaves big host tensors unpacked")
BATCH_ISEND_IRECV = "batch_isend_irecv"


def calls():
    # MPI collective calls, plus runs of our own algorithms (TORCH_MPIGPU_ALGO): one per bucket
    return torch_mpi_gpu._C.mpi_call_count() + sum(torch_mpi_gpu._C.algorithm_runs().values())


def counted(fn):
    before = calls()
    fn()
    return calls() - before


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    use_test_device()
    c = Checker(f"fusion(np={world})")
    pg = dist.distributed_c10d._get_default_group()

    c.section(HUNDRED_TENSORS)
    hundred_tensors(c, rank, world)
    c.section(MIXED_DTYPES)
    mixed_dtypes(c, rank, world, pg)
    c.section(COALESCING_MANAGER)
    coalescing_manager(c, rank, world)
    c.section(COALESCED_GATHER_SCATTER)
    coalesced_gather_scatter(c, rank, world)
    c.section(FUSION_BYTES)
    fusion_bytes(c, rank, world)
    c.section(FUSE_BELOW_BYTES)
    fuse_below_bytes(c, world)
    c.section(BATCH_ISEND_IRECV)
    batch_isend_irecv_ring(c, rank, world)
    return c.finish()


def hundred_tensors(c, rank, world):
    # 100 fp32 tensors of odd sizes in one allreduce: one MPI call
    sizes = [1 + (i * 37) % 300 for i in range(100)]
    per_rank = [[make_input(10 + i, r, n, torch.float32) for i, n in enumerate(sizes)]
                for r in range(world)]
    mine = [t.clone() for t in per_rank[rank]]
    n = counted(lambda: dist.all_reduce_coalesced(mine))
    c.true("100 tensors, one dtype: 1 MPI call", n == 1, f"{n} calls")
    for i in (0, 17, 99):
        want, bound = reduced("sum", [per_rank[r][i] for r in range(world)], torch.float32)
        c.close(f"fused allreduce tensor {i}", mine[i], want, torch.float32, bound=bound)


def mixed_dtypes(c, rank, world, pg):
    # mixed dtypes: grouped, one call per dtype (3 here)
    dts = [torch.float32, torch.int64, torch.bfloat16] * 10
    per_rank = [[make_input(200 + i, r, 5 + i, dt) for i, dt in enumerate(dts)] for r in range(world)]
    mine = [t.clone() for t in per_rank[rank]]
    n = counted(lambda: pg.allreduce_coalesced(mine, dist.AllreduceCoalescedOptions()).wait())
    c.true("30 tensors of 3 dtypes: 3 MPI calls", n == 3, f"{n} calls")
    for i in (0, 1, 2, 29):
        want, bound = reduced("sum", [per_rank[r][i] for r in range(world)], dts[i])
        c.close(f"mixed-dtype fused allreduce tensor {i} {dts[i]}", mine[i], want, dts[i],
                bound=bound)


def coalescing_manager(c, rank, world):
    # the coalescing manager (what torch's _coalescing_manager / DTensor use): one call
    parts = [make_input(300 + i, rank, 64, torch.float32) for i in range(50)]
    def coalesced():
        with dist._coalescing_manager(async_ops=True) as cm:
            for p in parts:
                dist.all_reduce(p)
        cm.wait()
    n = counted(coalesced)
    c.true("coalescing manager, 50 all_reduces: 1 MPI call", n == 1, f"{n} calls")
    want, bound = reduced("sum", [make_input(349, r, 64, torch.float32) for r in range(world)],
                          torch.float32)
    c.close("coalescing manager result", parts[49], want, torch.float32, bound=bound)


def coalesced_gather_scatter(c, rank, world):
    # coalesced all_gather_into_tensor / reduce_scatter_tensor (FSDP's calls): one call each
    ins = [make_input(400 + i, rank, 3 + i, torch.float32) for i in range(10)]
    outs = [torch.empty(world * (3 + i)) for i in range(10)]
    def gather():
        with dist._coalescing_manager(async_ops=False):
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
    n = counted(gather)
    c.true("10 coalesced all_gather_into_tensor: 1 MPI call", n == 1, f"{n} calls")
    for i in (0, 9):
        c.close(f"coalesced all_gather_into_tensor {i}", outs[i],
                torch.cat([make_input(400 + i, r, 3 + i, torch.float32) for r in range(world)]))
    bigs = [[make_input(500 + i, r, world * (2 + i), torch.float32) for i in range(10)]
            for r in range(world)]
    outs = [torch.empty(2 + i) for i in range(10)]
    mine = [b.clone() for b in bigs[rank]]
    def scatter():
        with dist._coalescing_manager(async_ops=False):
            for o, i in zip(outs, mine):
                dist.reduce_scatter_tensor(o, i, op=dist.ReduceOp.AVG)
    n = counted(scatter)
    c.true("10 coalesced reduce_scatter_tensor: 1 MPI call", n == 1, f"{n} calls")
    for i in (0, 9):
        m = 2 + i
        full, bound = reduced("avg", [bigs[r][i] for r in range(world)], torch.float32)
        mine_part = slice(rank * m, (rank + 1) * m)
        c.close(f"coalesced reduce_scatter_tensor avg {i}", outs[i], full[mine_part],
                torch.float32, bound=bound[mine_part])


def fusion_bytes(c, rank, world):
    # TORCH_MPIGPU_FUSION_BYTES caps a bucket (read when a group is created)
    os.environ["TORCH_MPIGPU_FUSION_BYTES"] = "4096"
    small = dist.new_group(list(range(world)))
    ts = [torch.full((256,), float(rank + i)) for i in range(100)]  # 1 KiB each: 4 per bucket
    n = counted(lambda: dist.all_reduce_coalesced(ts, group=small))
    c.true("FUSION_BYTES=4096, 100 x 1 KiB: 25 MPI calls", n == 25, f"{n} calls")
    c.close("capped buckets result", ts[99], torch.full((256,), float(sum(r + 99 for r in range(world)))))
    os.environ["TORCH_MPIGPU_FUSION_BYTES"] = "0"
    alone = dist.new_group(list(range(world)))
    ts = [torch.full((8,), 1.0) for _ in range(10)]
    n = counted(lambda: dist.all_reduce_coalesced(ts, group=alone))
    c.true("FUSION_BYTES=0: one call per tensor", n == 10, f"{n} calls")
    del os.environ["TORCH_MPIGPU_FUSION_BYTES"]


def fuse_below_bytes(c, world):
    # in a group without a GPU, tensors of FUSE_BELOW_BYTES or more are reduced in place and the
    # smaller ones packed; where a member has a GPU everything is packed, on every rank alike
    # (a CUDA rank and a CPU rank must cut the same buckets: MPIGPU_TEST_DEVICE=mixed)
    host_only = not torch.cuda.is_available()
    for limit, want in (("1024", 2 if host_only else 1), (None, 1)):
        if limit:
            os.environ["TORCH_MPIGPU_FUSE_BELOW_BYTES"] = limit
        g = dist.new_group(list(range(world)))
        ts = [torch.full((16,), 1.0), torch.full((256,), 2.0), torch.full((16,), 3.0)]
        n = counted(lambda: dist.all_reduce_coalesced(ts, group=g))
        c.true(f"FUSE_BELOW_BYTES={limit or 'default'}: 2 x 64 B + 1 KiB in {want} call(s)",
               n == want, f"{n} calls")
        for i, v in enumerate((1.0, 2.0, 3.0)):
            c.close(f"FUSE_BELOW_BYTES={limit or 'default'} tensor {i}", ts[i],
                    torch.full_like(ts[i], v * world))
        os.environ.pop("TORCH_MPIGPU_FUSE_BELOW_BYTES", None)


def batch_isend_irecv_ring(c, rank, world):
    # batch_isend_irecv: a ring, all posted together, completed together
    if world > 1:
        send = torch.full((1000,), float(rank))
        recv = torch.empty(1000)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
               dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.close("batch_isend_irecv ring", recv, torch.full((1000,), float((rank - 1) % world)))


if __name__ == "__main__":
    run(main)
