"""Random differential soak (#24): random_ops.py's cases (every collective, dtype, reduce op, root,
in place or not, sync or async with waits in shuffled order) plus what the device paths add:
sizes 0, 1, odd and one element either side of every size threshold in effect (ALGO_MIN_BYTES,
NODE_SHARED_GPU_ALLREDUCE_BYTES, CUDA_DIRECT_BYTES, STAGING_CHUNK_BYTES, ALGO_PIECE_BYTES, NODE_ONE_SHOT_BYTES,
NODE_BUFFER_BYTES, NODE_SINGLE_COPY_BYTES: the tests lower them so those sizes stay small), tensors that are views at an
offset into a larger buffer (whose other elements must stay untouched), point-to-point rings, and
on a GPU inputs produced on a side stream that is still busy when the op is issued. Expected
values are computed on the CPU from inputs every rank rebuilds (common.make_input), never on the
device under test. Seeded: every rank draws the same cases from MPIGPU_RANDOM_SEED; a failure
names its case, and the seed and MPIGPU_TEST_SEED_OFFSET replay it. On CPU CI it runs with CPU
tensors, so a defect in the generator or the reference shows without a GPU."""

import os
import random

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import SEED_OFFSET, Checker, run, use_test_device
from random_ops import OPS, RED, CaseRun, run_batches

THRESHOLDS = ["TORCH_MPIGPU_ALGO_MIN_BYTES", "TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES",
              "TORCH_MPIGPU_CUDA_DIRECT_BYTES",
              "TORCH_MPIGPU_STAGING_CHUNK_BYTES", "TORCH_MPIGPU_ALGO_PIECE_BYTES",
              "TORCH_MPIGPU_NODE_ONE_SHOT_BYTES", "TORCH_MPIGPU_NODE_BUFFER_BYTES",
              "TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES"]
MAX_ELEMENTS = int(os.environ.get("MPIGPU_SOAK_MAX_ELEMENTS", str(1 << 18)))
SOAK_OPS = OPS + ["send_recv_ring"]
SENTINEL = 3  # the value around a view, which no op may change
BUSY_CYCLES = 20_000_000  # a side stream's producer sleeps this long on the GPU before its fill


def edge_sizes(dtype):
    """0, 1, odd sizes, and one element either side of every threshold (bytes -> elements)."""
    size = torch.tensor([], dtype=dtype).element_size()
    sizes = {0, 1, 7, 1001}
    for name in THRESHOLDS:
        at = int(torch_mpi_gpu.config.get(name)) // size
        sizes |= {n for n in (at - 1, at, at + 1) if 0 <= n <= MAX_ELEMENTS}
    return sorted(sizes)


class SoakCase(CaseRun):
    """A random_ops case, then: an edge size (40%), a view at an offset (30% of the ops that
    write their input), a producer on a busy side stream (30% on a GPU)."""

    VIEW_OPS = ("all_reduce", "reduce", "broadcast")

    def __init__(self, rng, idx, rank, world, on_gpu):
        super().__init__(rng, idx, rank, world)
        self.op = rng.choice(SOAK_OPS) if world > 1 else self.op
        if rng.random() < 0.4:
            self.shape = [rng.choice(edge_sizes(self.dtype))]
        self.offset = rng.choice([1, 3, 64]) if (self.op in self.VIEW_OPS and
                                                 rng.random() < 0.3) else 0
        # drawn on every rank alike (a mixed group's CPU ranks draw it too, and ignore it)
        self.side_stream = rng.random() < 0.3 and on_gpu
        self.desc = (f"case {idx}: {self.op} {self.dtype} {self.red} shape={self.shape} "
                     f"root={self.root} inplace={self.inplace} offset={self.offset} "
                     f"side_stream={self.side_stream}")

    def issue(self, async_op):
        if not self.side_stream:
            return self._issue(async_op)
        producer = torch.cuda.Stream()
        producer.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(producer):
            torch.cuda._sleep(BUSY_CYCLES)  # the inputs below are made after this, on this stream
            return self._issue(async_op)

    def _issue(self, async_op):
        if self.op == "send_recv_ring":
            right, left = (self.rank + 1) % self.world, (self.rank - 1) % self.world
            self.mine = self.inp(self.rank)
            self.out = torch.full_like(self.mine, SENTINEL)
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, self.mine, right),
                                            dist.P2POp(dist.irecv, self.out, left)])
            return _AllOf(works) if async_op else _AllOf(works).wait()
        if not self.offset:
            return super().issue(async_op)
        # the op's tensor is a view into a larger buffer, SENTINEL around it
        n = self.inp(self.rank).numel()
        self.base = torch.full((self.offset + n + 5,), SENTINEL, dtype=self.dtype)
        self.mine = self.base[self.offset:self.offset + n].view(self.shape)
        self.mine.copy_(self.inp(self.rank))
        if self.op == "all_reduce":
            return dist.all_reduce(self.mine, op=RED[self.red], async_op=async_op)
        if self.op == "reduce":
            return dist.reduce(self.mine, dst=self.root, op=RED[self.red], async_op=async_op)
        if self.rank != self.root:
            self.mine.zero_()
        return dist.broadcast(self.mine, src=self.root, async_op=async_op)

    def check(self, c):
        # the reference from inputs rebuilt on the CPU, not from the device's own arithmetic
        with torch.device("cpu"):
            if hasattr(self, "big"):
                self.big = [b.cpu() for b in self.big]
            if self.op == "send_recv_ring":
                c.close(self.desc, self.out, self.inp((self.rank - 1) % self.world))
                c.close(self.desc + " (sender's input unchanged)", self.mine, self.inp(self.rank))
            else:
                super().check(c)
            if self.offset:
                base = self.base.cpu()
                n = self.mine.numel()
                outside = torch.cat([base[:self.offset], base[self.offset + n:]])
                c.close(self.desc + " (the elements around the view untouched)", outside,
                        torch.full_like(outside, SENTINEL))


class _AllOf:
    """One wait() for the works of a batch_isend_irecv."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for w in self.works:
            w.wait()
        return True


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = use_test_device().type == "cuda"
    seed = int(os.environ.get("MPIGPU_RANDOM_SEED", "4321"))
    cases = int(os.environ.get("MPIGPU_RANDOM_CASES", "300"))
    c = Checker(f"device_soak(np={world}, seed={seed}, cases={cases}, "
                f"device={torch.get_default_device()})", defer_device_reads=True)
    c.section("random cases against the CPU reference")
    rng = random.Random((seed + SEED_OFFSET) * 100 + world)  # the same stream on every rank
    # (results are read on the host: the GPU's queued work first)
    run_batches(c, rng, cases, lambda i: SoakCase(rng, i, rank, world, on_gpu),
                settle=torch.cuda.synchronize if on_gpu else lambda: None)
    # every rank drew the same cases; a rank that ran fewer (a lost case) shows as a count
    counts = torch.tensor([cases], dtype=torch.int64)
    dist.all_reduce(counts)
    c.true("every rank ran every case", int(counts) == cases * world, str(int(counts)))
    return c.finish()


if __name__ == "__main__":
    run(main)
