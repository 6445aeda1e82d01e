"""What torch (and trainers on it) query or call on a backend besides the ops, one section per row
of docs/operations.md's "Backend surface" table: each answers as documented there (works, or
gives torch's answer for an unsupported feature, as gloo does). Run by test_multirank.py at 2
ranks; expected values come from torch's version and wall clocks, never from mpigpu itself."""

import math
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_mpi_gpu  # noqa: F401
from common import Checker, run

SECTIONS = ("supports flags", "collective durations", "sequence numbers", "time estimate",
            "get_error", "mem-pool registration", "eager connect", "unsupported: torch's answer",
            "a finished blocking op's result and future")
CPU = torch.device("cpu")
LATE_SECONDS = 0.3  # how long rank 1 keeps rank 0 waiting inside a collective


def supports_flags(c, b):
    c.true("supports_coalescing", b.supports_coalescing is True)
    # torch 2.8 splits NCCL groups only (Backend::split came in 2.9)
    has_split = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 9)
    c.true("supports_splitting follows torch", b.supports_splitting is has_split,
           f"{b.supports_splitting} on torch {torch.__version__}")
    if hasattr(b, "supports_shrinking"):  # torch >= 2.10
        c.true("supports_shrinking", b.supports_shrinking is True)
    else:
        c.skip("supports_shrinking", f"torch {torch.__version__} has no shrink_group")
    # (torch 2.15 renamed it _supports_time_estimate)
    estimate = "supports_time_estimate" if hasattr(b, "supports_time_estimate") else \
        "_supports_time_estimate"
    c.true(estimate, getattr(b, estimate) is True, str(getattr(b, estimate, "absent")))
    c.true("supports_tensor_alloc", b.supports_tensor_alloc(CPU) is False)


def durations(c, pg, rank):
    c.true("_enable_collectives_timing accepted", pg._enable_collectives_timing() is None)
    t = torch.ones(1000)
    dist.barrier()
    if rank == 1:
        time.sleep(LATE_SECONDS)
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    wall_ms = (time.monotonic() - start) * 1000
    if not hasattr(work, "_get_duration"):
        c.skip("Work._get_duration", f"torch {torch.__version__} does not bind it")
        return
    ms = work._get_duration()
    c.true("duration within the wall clock around the op", 0 <= ms <= wall_ms + 1,
           f"{ms} ms, wall {wall_ms} ms")
    if rank == 0:  # waited inside the op for the late rank
        c.true("duration includes the wait for the late rank", ms >= LATE_SECONDS * 1000 * 0.8,
               f"{ms} ms")


def sequence_numbers(c, b, rank, world):
    before = b._get_sequence_number_for_group()
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    if world > 1:  # point-to-point differs per rank and is not counted
        peer = 1 - rank if rank < 2 else None
        if peer is not None:
            (dist.send if rank == 0 else dist.recv)(torch.ones(2), peer)
    after = b._get_sequence_number_for_group()
    c.true("three collectives counted", after - before == 3, f"{before} -> {after}")
    seen = [None] * world
    dist.all_gather_object(seen, after)
    c.true("the same on every rank", len(set(seen)) == 1, str(seen))


def time_estimate(c, rank, world):
    from torch.distributed.distributed_c10d import _time_estimator
    # the model's settings, read when a group is made: a group of every rank made with them set
    lat_us, mb_per_s = 2.0, 1000.0
    cost = {"TORCH_MPIGPU_COST_LATENCY_NS": "2000", "TORCH_MPIGPU_COST_MB_PER_S": "1000",
            "TORCH_MPIGPU_COST_ACROSS_LATENCY_NS": "2000", "TORCH_MPIGPU_COST_ACROSS_MB_PER_S": "1000"}
    os.environ.update(cost)
    try:
        sub = dist.new_group(list(range(world)))
    finally:
        for name in cost:
            del os.environ[name]
    sb = sub._get_backend(CPU)

    def estimate(group, fn):
        with _time_estimator(group=group, device=CPU) as cm:
            fn()
        return cm.estimated_time

    seq = sb._get_sequence_number_for_group()
    t = torch.full((1024,), float(rank + 1))
    us = estimate(sub, lambda: dist.all_reduce(t, group=sub))
    c.true("all_reduce estimated, not run: the tensor unchanged", bool((t == rank + 1).all()),
           str(t[:4]))
    # a ring: 2(p-1) messages, 2(p-1)/p of the bytes over each link (microseconds, as NCCL's)
    p = world
    model = 2 * (p - 1) * lat_us + 2 * (p - 1) / p * t.nbytes / mb_per_s
    c.true("all_reduce: the model's time for the settings given",
           math.isclose(us, model, rel_tol=1e-5), f"{us} us, the model {model} us")
    bigger = estimate(sub, lambda: dist.all_reduce(torch.ones(1 << 20), group=sub))
    c.true("a bigger all_reduce takes longer", bigger > us, f"{us} -> {bigger} us")
    c.true("barrier: log2(p) zero-byte messages",
           math.isclose(estimate(sub, lambda: dist.barrier(group=sub)),
                        math.ceil(math.log2(p)) * lat_us, rel_tol=1e-5))
    if rank < 2:  # point-to-point counts too: one message, and neither side waits for the other
        x = torch.full((256,), float(rank))
        us = estimate(sub, lambda: (dist.send if rank == 0 else dist.recv)(x, 1 - rank, group=sub))
        c.true("send/recv: one message", math.isclose(us, lat_us + x.nbytes / mb_per_s,
                                                      rel_tol=1e-5), f"{us} us")
        c.true("recv estimated, not run: the tensor unchanged", bool((x == rank).all()), str(x[:4]))
    c.true("estimated ops take no sequence number", sb._get_sequence_number_for_group() == seq,
           f"{seq} -> {sb._get_sequence_number_for_group()}")
    with _time_estimator(group=sub, device=CPU):
        c.raises("a wrong argument still raises inside", TypeError,
                 lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND, group=sub),
                 ["allreduce", f"[rank {rank}]"])
    c.raises("_end_time_estimate without a start", ValueError, sb._end_time_estimate,
             ["_end_time_estimate", f"[rank {rank}]", "_start_time_estimate"])
    default = estimate(None, lambda: dist.all_reduce(torch.ones(1024)))
    c.true("the default settings: a positive estimate", default > 0, f"{default} us")
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, group=sub)
    c.true("the group runs ops again after it", bool((t == world * (world + 1) / 2).all()), str(t))


def get_error(c, b, world):
    ok = torch._C._distributed_c10d.ErrorType.SUCCESS
    c.true("SUCCESS on a working group", b.get_error() == ok, str(b.get_error()))
    sub = dist.new_group(list(range(world)))
    sb = sub._get_backend(CPU)
    dist.all_reduce(torch.ones(2), group=sub)
    c.true("SUCCESS on a subgroup", sb.get_error() == ok, str(sb.get_error()))
    sb.abort()
    c.true("COMM_ERROR after abort()",
           sb.get_error() == torch._C._distributed_c10d.ErrorType.COMM_ERROR, str(sb.get_error()))
    c.raises("an op on the aborted group names it", ValueError,
             lambda: sb.allreduce([torch.ones(2)]).wait(), ["allreduce", f"[rank {dist.get_rank()}]", "aborted"])


def mem_pools(c, b):
    # Megatron registers its pool on the group's backend unconditionally; a CUDA MemPool needs a
    # GPU, and mpigpu ignores what it is given
    pool = object()
    c.true("register_mem_pool accepted", b.register_mem_pool(pool) is None)
    c.true("deregister_mem_pool accepted", b.deregister_mem_pool(pool) is None)
    t = torch.ones(3)
    dist.all_reduce(t)
    c.true("ops unchanged after it", bool((t == dist.get_world_size()).all()), str(t))


def eager_connect(c, b):
    c.true("eager_connect_single_device accepted", b.eager_connect_single_device(CPU) is None)
    t = torch.full((2,), float(dist.get_rank()))
    dist.broadcast(t, 0)
    c.true("ops unchanged after it", bool((t == 0).all()), str(t))


def unsupported(c, pg, b):
    for name, must in (("memory_stats", "getMemoryStats"), ("mem_allocator", "getMemAllocator")):
        if hasattr(type(b), name):  # bound by torch's Backend from 2.9 on
            c.raises(name, RuntimeError, lambda: getattr(b, name)() if name == "memory_stats"
                     else b.mem_allocator, ["mpigpu", must])
        else:
            c.skip(name, f"torch {torch.__version__} does not bind it")
    c.raises("on-completion hook (NCCL only)", RuntimeError,
             lambda: pg._register_on_completion_hook(lambda info: None), ["mpigpu"])
    try:  # torch 2.15 forwards it to any backend; earlier ones serve gloo and NCCL only
        seq = pg._get_sequence_number_for_group()
    except RuntimeError as e:
        c.true("ProcessGroup sequence number: gloo and NCCL only", "sequence numbers" in str(e),
               str(e))
    else:
        c.true("ProcessGroup sequence number: the backend's",
               seq == b._get_sequence_number_for_group(), str(seq))


def finished_blocking_op(c, b, world):
    # A small blocking host op runs on the caller's thread and its Work then holds the outputs
    # weakly (WorkMPIGPU::holdOutputsWeakly): result() and the future still give the caller's
    # tensor, with the reduced values.
    t = torch.ones(5)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    work = b.allreduce([t], opts)
    work.wait()
    out = work.result()
    c.true("result() is the caller's tensor", len(out) == 1 and out[0].data_ptr() == t.data_ptr(),
           f"{out}")
    c.close("result() holds the sum", out[0], torch.full((5,), float(world)))
    fut = work.get_future()
    fut.wait()
    value = fut.value()
    c.true("the future's value is the caller's tensor",
           len(value) == 1 and value[0].data_ptr() == t.data_ptr(), f"{value}")


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    b = pg._get_backend(CPU)
    c = Checker("backend surface")
    steps = [lambda: supports_flags(c, b), lambda: durations(c, pg, rank),
             lambda: sequence_numbers(c, b, rank, world), lambda: time_estimate(c, rank, world),
             lambda: get_error(c, b, world), lambda: mem_pools(c, b), lambda: eager_connect(c, b),
             lambda: unsupported(c, pg, b), lambda: finished_blocking_op(c, b, world)]
    for name, step in zip(SECTIONS, steps):
        c.section(name)
        step()
    return c.finish()


if __name__ == "__main__":
    sys.exit(run(main))
