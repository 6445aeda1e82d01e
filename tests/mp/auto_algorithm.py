"""The automatic algorithm choice on host tensors (TORCH_MPIGPU_ALGO=auto, no GPU in the group).
Where more than one rank shares a node (the same count on every node, read from the group's
description), the node algorithm takes every reduction of any size and dtype but fp32 all_reduce
inside NODE_HOST_MPI_FROM_BYTES .. NODE_HOST_MPI_BELOW_BYTES (MPI's own); where nodes hold
different counts, every op from NODE_ACROSS_MIN_BYTES. Elsewhere
(TORCH_MPIGPU_NODE_BUFFER_BYTES=0, one rank per node, a single rank), the rules at their thresholds: fp16/bf16 all_reduce and reduce_scatter take our ring from
TORCH_MPIGPU_HOST_HALF_RING_BYTES, any reduce_scatter from TORCH_MPIGPU_HOST_RS_RING_BYTES, in
groups that span nodes any all_reduce from TORCH_MPIGPU_HOST_ACROSS_RING_BYTES, and everything
else (fp32 all_reduce inside one node however big, reduce of any dtype) MPI's own. Sizes just below and
at each threshold (the input's bytes); which ran is read from the algorithm counters, and every
result is checked against the float64 reference within its bound."""

import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, make_input, reduced, run

STALE = b"left by a killed job"


UNEVEN = "nodes holding different counts: the node algorithm for every op from NODE_ACROSS_MIN_BYTES"


def uneven_nodes(c, rank, world, ran, all_reduce, reduce_scatter):
    """Nodes holding different numbers of ranks: all_reduce, reduce_scatter, all_gather and
    broadcast (from every root, those above the lanes included) take the node algorithm from
    NODE_ACROSS_MIN_BYTES, MPI's own just below (reduce_scatter's ring starts higher, at
    HOST_RS_RING_BYTES)."""
    c.section(UNEVEN)
    n = int(torch_mpi_gpu.config.get("TORCH_MPIGPU_NODE_ACROSS_MIN_BYTES")) // 4
    for numel, want in ((n - 1, False), (n, True)):
        which = "node" if want else "MPI's own"
        node = ran("node", lambda: all_reduce(torch.float32, numel, 90 + numel % 7))
        c.true(f"fp32 all_reduce of {numel * 4} bytes: {which}", node == want)
        for root in range(world):
            inputs = [make_input(95 + root, r, numel, torch.float32) for r in range(world)]
            b = inputs[rank].clone() if rank == root else torch.zeros_like(inputs[0])
            node = ran("node", lambda: dist.broadcast(b, src=root))
            c.true(f"broadcast of {numel * 4} bytes from {root}: {which}", node == want)
            c.close(f"broadcast of {numel * 4} bytes from {root}", b, inputs[root])
        # the op's bytes: reduce_scatter's input (every rank's block), all_gather's output
        per_rank = -(-numel // world) if want else numel // world
        node = ran("node", lambda: reduce_scatter(torch.float32, per_rank, 97))
        c.true(f"fp32 reduce_scatter of {per_rank * world * 4} bytes: {which}", node == want)
        inputs = [make_input(99, r, per_rank, torch.float32) for r in range(world)]
        out = torch.empty(world * per_rank)
        node = ran("node", lambda: dist.all_gather_into_tensor(out, inputs[rank]))
        c.true(f"all_gather of {per_rank * world * 4} bytes: {which}", node == want)
        c.close(f"all_gather of {per_rank * world * 4} bytes", out, torch.cat(inputs))
    return c.finish()


SHARED_GPU = ("CUDA tensors on a GPU the ranks share: the node algorithm's leader form for all_gather, "
              "all_reduce from NODE_SHARED_GPU_ALLREDUCE_BYTES, reduce_scatter from ALGO_MIN_BYTES")


def shared_gpu(c, rank, world, ran, algo_min):
    """Every rank on the one GPU (the lent machine): all_gather at any size, all_reduce from
    NODE_SHARED_GPU_ALLREDUCE_BYTES and reduce_scatter from ALGO_MIN_BYTES (the op's bytes, any
    dtype) take the node algorithm in the leader form, MPI's own just below; broadcast stays MPI's
    own. Results against the CPU reference."""
    c.section(SHARED_GPU)
    dev = torch.device("cuda", torch.cuda.current_device())
    allreduce_min = int(torch_mpi_gpu.config.get("TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES"))
    for dtype in (torch.float32, torch.bfloat16):
        size = torch.empty(0, dtype=dtype).element_size()
        for numel, want in ((allreduce_min // size - 1, False), (allreduce_min // size, True)):
            which = "node" if want else "MPI's own"
            inputs = [make_input(110, r, numel, dtype) for r in range(world)]
            t = inputs[rank].to(dev)
            node = ran("node", lambda: dist.all_reduce(t))
            c.true(f"CUDA {dtype} all_reduce of {numel * size} bytes: {which}", node == want)
            expect, bound = reduced("sum", inputs, dtype)
            c.close(f"CUDA {dtype} all_reduce of {numel * size} bytes", t.cpu(), expect, dtype, bound=bound)
        for numel, want in ((algo_min // size - 1, False), (algo_min // size, True)):
            which = "node" if want else "MPI's own"
            per_rank = -(-numel // world) if want else numel // world  # the input's bytes either side
            inputs = [make_input(111, r, world * per_rank, dtype) for r in range(world)]
            out = torch.empty(per_rank, dtype=dtype, device=dev)
            node = ran("node", lambda: dist.reduce_scatter_tensor(out, inputs[rank].to(dev)))
            c.true(f"CUDA {dtype} reduce_scatter of {world * per_rank * size} bytes: {which}", node == want)
            expect, bound = reduced("sum", inputs, dtype)
            part = slice(rank * per_rank, (rank + 1) * per_rank)
            c.close(f"CUDA {dtype} reduce_scatter of {world * per_rank * size} bytes", out.cpu(),
                    expect[part], dtype, bound=bound[part])
    for numel in (1, 1000, algo_min // 4 + 3):
        inputs = [make_input(112, r, numel, torch.float32) for r in range(world)]
        out = torch.empty(world * numel, device=dev)
        node = ran("node", lambda: dist.all_gather_into_tensor(out, inputs[rank].to(dev)))
        c.true(f"CUDA all_gather of {world * numel * 4} bytes: node", node)
        c.close(f"CUDA all_gather of {world * numel * 4} bytes", out.cpu(), torch.cat(inputs))
        b = inputs[0].to(dev)
        node = ran("node", lambda: dist.broadcast(b, src=0))
        c.true(f"CUDA broadcast of {numel * 4} bytes: MPI's own", not node)
        c.close(f"CUDA broadcast of {numel * 4} bytes", b.cpu(), inputs[0])
    described = dist.group.WORLD._get_backend(dev).describe()  # (the slots exist by now)
    c.true("the group's description says the leader form", "the leader form" in described, described)


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"auto_algorithm(np={world})")
    # MPIGPU_TEST_STALE_SEGMENT: a job killed while it made its segment left its name behind, and
    # this rank 0 has that job's pid: the name of its first segment (made at the first node op)
    # is taken, as CI once met. The node algorithm must still run, under a name of its own.
    stale = stale_segment() if os.environ.get("MPIGPU_TEST_STALE_SEGMENT") == "1" and rank == 0 else None
    if stale:
        stale.write_bytes(STALE)
    try:
        return checks(c, rank, world, stale)
    finally:
        if stale:
            stale.unlink(missing_ok=True)


def stale_segment():
    return Path(f"/dev/shm/mpigpu-{os.getpid()}-0")


class Ops:
    """What the sections share: the checker, this rank, the group's size, the two host thresholds
    most sections test at, and the ops they run: each checks its result against the float64
    reference and says whether the ring (or the algorithm named) ran it."""

    def __init__(self, c, rank, world):
        self.c, self.rank, self.world = c, rank, world
        self.half_ring = int(torch_mpi_gpu.config.get("TORCH_MPIGPU_HOST_HALF_RING_BYTES"))
        self.rs_ring = int(torch_mpi_gpu.config.get("TORCH_MPIGPU_HOST_RS_RING_BYTES"))

    def ran(self, name, fn):
        before = torch_mpi_gpu._C.algorithm_runs()[name]
        fn()
        return torch_mpi_gpu._C.algorithm_runs()[name] > before

    def ring_ran(self, fn):
        return self.ran("ring", fn)

    def all_reduce(self, dtype, numel, seed):
        c, rank, world = self.c, self.rank, self.world
        inputs = [make_input(seed, r, numel, dtype) for r in range(world)]
        t = inputs[rank].clone()
        ring = self.ring_ran(lambda: dist.all_reduce(t))
        want, bound = reduced("sum", inputs, dtype)
        c.close(f"all_reduce {dtype} {numel * t.element_size()} bytes", t, want, dtype, bound=bound)
        return ring

    def reduce_scatter(self, dtype, n, seed):
        c, rank, world = self.c, self.rank, self.world
        inputs = [make_input(seed, r, world * n, dtype) for r in range(world)]
        out = torch.empty(n, dtype=dtype)
        ring = self.ring_ran(lambda: dist.reduce_scatter_tensor(out, inputs[rank].clone()))
        want, bound = reduced("sum", inputs, dtype)
        part = slice(rank * n, (rank + 1) * n)
        c.close(f"reduce_scatter_tensor {dtype} {world * n * out.element_size()} bytes", out,
                want[part], dtype, bound=bound[part])
        return ring


def checks(c, rank, world, stale):
    ops = Ops(c, rank, world)
    if torch.cuda.is_available():
        # a member has a GPU (every rank here): the device rule for host tensors too
        c.section("a member has a GPU: MPI's own below ALGO_MIN_BYTES, then the ring")
        a_member_has_a_gpu(ops)
        return c.finish()

    described = dist.group.WORLD._get_backend(torch.device("cpu")).describe()
    if "(not uniform)" in described and int(torch_mpi_gpu.config.get("TORCH_MPIGPU_NODE_BUFFER_BYTES")) > 0:
        return uneven_nodes(c, rank, world, ops.ran, ops.all_reduce, ops.reduce_scatter)
    shape = re.search(r"nodes: (\d+) nodes? x (\d+) ranks?", described)
    shares_nodes = shape is None or int(shape[2]) > 1  # one rank per node: nothing to share
    if world > 1 and int(torch_mpi_gpu.config.get("TORCH_MPIGPU_NODE_BUFFER_BYTES")) > 0 and shares_nodes:
        c.section("ranks sharing a node: the node algorithm for reductions, all_gather and broadcast")
        ranks_sharing_a_node(ops, shape, described, stale)
        return c.finish()

    c.section("fp16/bf16 all_reduce: the ring from HOST_HALF_RING_BYTES")
    half_all_reduce(ops)
    across = int(torch_mpi_gpu.config.get("TORCH_MPIGPU_HOST_ACROSS_RING_BYTES"))
    if shape is not None and int(shape[1]) > 1:
        c.section("fp32 all_reduce across nodes: the ring from HOST_ACROSS_RING_BYTES")
        fp32_all_reduce_across_nodes(ops, across)
    else:
        c.section("fp32 all_reduce inside one node: MPI's own at any size")
        fp32_all_reduce_inside_one_node(ops, across)
    c.section("reduce_scatter: the ring from HOST_RS_RING_BYTES (fp16/bf16 from HOST_HALF_RING)")
    reduce_scatter_ring(ops)
    c.section("reduce: MPI's own")
    reduce_mpi_own(ops)
    return c.finish()


def a_member_has_a_gpu(ops):
    c, world = ops.c, ops.world
    algo_min = int(torch_mpi_gpu.config.get("TORCH_MPIGPU_ALGO_MIN_BYTES"))
    c.true("fp32 all_reduce below ALGO_MIN_BYTES: MPI's own",
           not ops.all_reduce(torch.float32, algo_min // 4 - 1, 5))
    at = ops.all_reduce(torch.float32, algo_min // 4, 6)
    c.true("fp32 all_reduce at ALGO_MIN_BYTES: the ring", at, f"ring ran: {at}")
    one_node = "1 node x" in dist.group.WORLD._get_backend(torch.device("cpu")).describe()
    if world > 1 and one_node and int(torch_mpi_gpu.config.get("TORCH_MPIGPU_NODE_BUFFER_BYTES")) > 0:
        shared_gpu(c, ops.rank, world, ops.ran, algo_min)  # (every rank on the one GPU)


def ranks_sharing_a_node(ops, shape, described, stale):
    """The node algorithm for reduce_scatter of any size and dtype, all_gather, broadcast, and
    all_reduce outside the window where MPI's own takes fp32 (NODE_HOST_MPI_FROM_BYTES to below
    NODE_HOST_MPI_BELOW_BYTES), fp16/bf16 at any size; a stale
    segment of the same name left alone."""
    c, rank, world, ran = ops.c, ops.rank, ops.world, ops.ran
    c.true("the group's description: nodes x ranks per node = world",
           shape is not None and int(shape[1]) * int(shape[2]) == world, described)
    for i, (dtype, numel) in enumerate([(torch.float32, 1), (torch.float32, ops.rs_ring),
                                        (torch.bfloat16, ops.half_ring), (torch.float16, 3)]):
        node = ran("node", lambda: ops.reduce_scatter(dtype, numel, 70 + i))
        c.true(f"{dtype} reduce_scatter of {numel} x {world} elements: node", node)
    for i, (dtype, numel) in enumerate([(torch.bfloat16, ops.half_ring), (torch.float16, 3)]):
        node = ran("node", lambda: ops.all_reduce(dtype, numel, 60 + i))
        c.true(f"{dtype} all_reduce of {numel} elements: node", node)
    # where a member's host runs more ranks than cores (as this job's crowding, agreed over the
    # group, says), the crowded window
    crowded = "; crowded:" in dist.group.WORLD._get_backend(torch.device("cpu")).describe()
    prefix = "TORCH_MPIGPU_NODE_HOST_MPI_" + ("CROWDED_" if crowded else "")
    window_from = int(torch_mpi_gpu.config.get(prefix + "FROM_BYTES"))
    window_below = int(torch_mpi_gpu.config.get(prefix + "BELOW_BYTES"))
    for i, (nbytes, want) in enumerate([(4, True), (window_from - 4, True), (window_from, False),
                                        (window_below - 4, False), (window_below, True)]):
        node = ran("node", lambda: ops.all_reduce(torch.float32, nbytes // 4, 64 + i))
        c.true(f"fp32 all_reduce of {nbytes} bytes: {'node' if want else 'MPI' + chr(39) + 's own'}",
               node == want, f"node ran: {node}")
    for i, (dtype, numel) in enumerate([(torch.float32, 1), (torch.int64, 5000)]):
        inputs = [make_input(80 + i, r, numel, dtype) for r in range(world)]
        out = torch.empty(world * numel, dtype=dtype)
        node = ran("node", lambda: dist.all_gather_into_tensor(out, inputs[rank]))
        c.true(f"{dtype} all_gather of {numel} elements: node", node)
        c.close(f"{dtype} all_gather result", out, torch.cat(inputs))
        root = world - 1
        b = inputs[rank].clone() if rank == root else torch.zeros_like(inputs[0])
        node = ran("node", lambda: dist.broadcast(b, src=root))
        c.true(f"{dtype} broadcast of {numel} elements: node", node)
        c.close(f"{dtype} broadcast result", b, inputs[root])
    if stale:
        c.true("the stale segment of the same name is left untouched",
               stale.exists() and stale.read_bytes() == STALE)


def half_all_reduce(ops):
    c, world, half_ring = ops.c, ops.world, ops.half_ring
    for i, dtype in enumerate((torch.float16, torch.bfloat16)):
        below = ops.all_reduce(dtype, half_ring // 2 - 1, 10 + i)
        at = ops.all_reduce(dtype, half_ring // 2, 20 + i)
        c.true(f"{dtype} all_reduce below {half_ring} bytes: MPI's own", not below)
        c.true(f"{dtype} all_reduce at {half_ring} bytes: the ring", at == (world > 1),
               f"ring ran: {at}")


def fp32_all_reduce_across_nodes(ops, across):
    c = ops.c
    below = ops.all_reduce(torch.float32, across // 4 - 1, 31)
    at = ops.all_reduce(torch.float32, across // 4, 32)
    c.true(f"fp32 all_reduce below {across} bytes: MPI's own", not below)
    c.true(f"fp32 all_reduce at {across} bytes: the ring", at, f"ring ran: {at}")


def fp32_all_reduce_inside_one_node(ops, across):
    c = ops.c
    c.true("fp32 all_reduce of 4 x HOST_RS_RING_BYTES: MPI's own",
           not ops.all_reduce(torch.float32, ops.rs_ring, 30))
    c.true("fp32 all_reduce of HOST_ACROSS_RING_BYTES: MPI's own",
           not ops.all_reduce(torch.float32, across // 4, 31))


def reduce_scatter_ring(ops):
    c, world, rs_ring, half_ring = ops.c, ops.world, ops.rs_ring, ops.half_ring
    per_rank = 4 * world  # fp32 input bytes per output element
    below = ops.reduce_scatter(torch.float32, (rs_ring - 1) // per_rank, 40)
    at = ops.reduce_scatter(torch.float32, -(-rs_ring // per_rank), 41)
    c.true(f"fp32 reduce_scatter below {rs_ring} bytes: MPI's own", not below)
    c.true(f"fp32 reduce_scatter from {rs_ring} bytes: the ring", at == (world > 1),
           f"ring ran: {at}")
    half = ops.reduce_scatter(torch.bfloat16, -(-half_ring // (2 * world)), 42)
    c.true(f"bf16 reduce_scatter from {half_ring} bytes: the ring", half == (world > 1),
           f"ring ran: {half}")


def reduce_mpi_own(ops):
    c, rank, world, half_ring = ops.c, ops.rank, ops.world, ops.half_ring
    inputs = [make_input(50, r, half_ring, torch.bfloat16) for r in range(world)]
    t = inputs[rank].clone()
    ring = ops.ring_ran(lambda: dist.reduce(t, dst=0))
    c.true(f"bf16 reduce of {2 * half_ring} bytes: MPI's own", not ring)
    if rank == 0:
        want, bound = reduced("sum", inputs, torch.bfloat16)
        c.close("bf16 reduce result", t, want, torch.bfloat16, bound=bound)
    else:
        c.close("bf16 reduce leaves non-roots alone", t, inputs[rank])


if __name__ == "__main__":
    run(main)
