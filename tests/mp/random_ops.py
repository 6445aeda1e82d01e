"""Randomized differential testing: many random cases (op, reduce op, dtype, shape, root,
in-place or not, sync or async, several in flight, waited in random order), each checked
against a reference every rank computes itself. Seeded and reproducible: every rank draws the
same cases from MPIGPU_RANDOM_SEED; MPIGPU_RANDOM_CASES sets how many (CI runs a few hundred per
world size; a longer run is one variable away)."""

import os
import random

import torch
import torch.distributed as dist

from common import SEED_OFFSET, Checker, make_input, reduced, run, use_test_device

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8, torch.bool]
RED = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG, "band": dist.ReduceOp.BAND,
       "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
OPS = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
       "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "all_reduce_coalesced"]


def pick_red(rng, dtype):
    choices = ["sum", "min", "max"]
    if dtype.is_floating_point:
        choices += ["avg", "product"]
    elif dtype != torch.bool:
        choices += ["band", "bor", "bxor", "product"]
    else:
        choices += ["band", "bor", "bxor"]
    return rng.choice(choices)


def shape_of(rng, numel_cap=40):
    dims = rng.randint(0, 3)
    shape = [rng.choice([0, 1, 2, 3, 5, 7]) if rng.random() < 0.9 else 0 for _ in range(dims)]
    while shape and int(torch.tensor(shape).prod()) > numel_cap:
        shape[rng.randrange(len(shape))] = 1
    return shape


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


class CaseRun:
    """Issues one random case; check() verifies it after the work completed."""

    def __init__(self, rng, idx, rank, world):
        self.op = rng.choice(OPS)
        self.dtype = rng.choice(DTYPES)
        self.red = pick_red(rng, self.dtype)
        self.kind = "prod" if self.red == "product" else "any"
        self.shape = shape_of(rng)
        self.root = rng.randrange(world)
        self.inplace = rng.random() < 0.5
        self.seed = 100_000 + idx
        self.rank, self.world = rank, world
        self.desc = (f"case {idx}: {self.op} {self.dtype} {self.red} shape={self.shape} "
                     f"root={self.root} inplace={self.inplace}")

    def inp(self, r, seed=None, shape=None):
        shape = self.shape if shape is None else shape
        t = make_input(self.seed if seed is None else seed, r, numel(shape), self.dtype, self.kind)
        return t.reshape(shape)

    def issue(self, async_op):
        op, rank, world, red = self.op, self.rank, self.world, RED[self.red]
        n = numel(self.shape)
        self.mine = self.inp(rank).clone()
        if op == "all_reduce":
            return dist.all_reduce(self.mine, op=red, async_op=async_op)
        if op == "reduce":
            return dist.reduce(self.mine, dst=self.root, op=red, async_op=async_op)
        if op == "broadcast":
            if rank != self.root:
                self.mine.zero_()
            return dist.broadcast(self.mine, src=self.root, async_op=async_op)
        if op == "all_gather":
            self.out = [torch.empty_like(self.mine) for _ in range(world)]
            return dist.all_gather(self.out, self.mine, async_op=async_op)
        if op == "all_gather_into_tensor":
            self.out = torch.empty(world * n, dtype=self.dtype)
            src = self.mine.reshape(-1)
            if self.inplace:  # the input is this rank's slice of the output
                src = self.out[rank * n:(rank + 1) * n]
                src.copy_(self.mine.reshape(-1))
            return dist.all_gather_into_tensor(self.out, src, async_op=async_op)
        if op == "reduce_scatter_tensor":
            self.big = [self.inp(r, self.seed + 1, [world * max(n, 1)]) for r in range(world)]
            self.out = torch.empty(max(n, 1), dtype=self.dtype)
            return dist.reduce_scatter_tensor(self.out, self.big[rank].clone(), op=red,
                                              async_op=async_op)
        if op == "all_to_all_single":
            self.split = lambda s, d: (s * 3 + d * 5 + self.seed) % 4  # noqa: E731
            ins = [make_input(self.seed, rank * 97 + d, self.split(rank, d), self.dtype)
                   for d in range(world)]
            self.out = torch.empty(sum(self.split(s, rank) for s in range(world)), dtype=self.dtype)
            return dist.all_to_all_single(self.out, torch.cat(ins),
                                          [self.split(s, rank) for s in range(world)],
                                          [self.split(rank, d) for d in range(world)],
                                          async_op=async_op)
        if op == "gather":
            self.out = [torch.empty_like(self.mine) for _ in range(world)] if rank == self.root else None
            return dist.gather(self.mine, gather_list=self.out, dst=self.root, async_op=async_op)
        if op == "scatter":
            self.out = torch.empty_like(self.mine)
            parts = [self.inp(r, self.seed + 2) for r in range(world)] if rank == self.root else None
            return dist.scatter(self.out, scatter_list=parts, src=self.root, async_op=async_op)
        if op == "all_reduce_coalesced":
            self.many = [self.inp(rank, self.seed + i, [i + 1]).clone() for i in range(3)]
            return dist.all_reduce_coalesced(self.many, op=red, async_op=async_op)
        raise ValueError(op)

    def check(self, c):
        op, rank, world = self.op, self.rank, self.world
        ref = lambda ins: reduced(self.red, ins, self.dtype)  # noqa: E731  (expected, bound)
        everyone = [self.inp(r) for r in range(world)]
        if op == "all_reduce":
            want, bound = ref(everyone)
            c.close(self.desc, self.mine, want, self.dtype, bound=bound)
        elif op == "reduce":
            want, bound = ref(everyone) if rank == self.root else (everyone[rank], None)
            c.close(self.desc, self.mine, want, self.dtype, bound=bound)
        elif op == "broadcast":
            c.close(self.desc, self.mine, everyone[self.root])
        elif op == "all_gather":
            c.close(self.desc, torch.stack(self.out) if self.out else torch.empty(0),
                    torch.stack(everyone))
        elif op == "all_gather_into_tensor":
            c.close(self.desc, self.out, torch.cat([e.reshape(-1) for e in everyone]))
        elif op == "reduce_scatter_tensor":
            m = self.out.numel()
            want, bound = ref(self.big)
            mine = slice(rank * m, (rank + 1) * m)
            c.close(self.desc, self.out, want[mine], self.dtype,
                    bound=bound[mine] if bound is not None else None)
        elif op == "all_to_all_single":
            want = torch.cat([make_input(self.seed, s * 97 + rank, self.split(s, rank), self.dtype)
                              for s in range(world)])
            c.close(self.desc, self.out, want)
        elif op == "gather":
            if rank == self.root:
                c.close(self.desc, torch.stack(self.out), torch.stack(everyone))
            else:  # a sender's input is only read
                c.close(self.desc + " (sender's input unchanged)", self.mine, everyone[rank])
        elif op == "scatter":
            c.close(self.desc, self.out, self.inp(rank, self.seed + 2))
        elif op == "all_reduce_coalesced":
            for i, t in enumerate(self.many):
                want, bound = ref([self.inp(r, self.seed + i, [i + 1]) for r in range(world)])
                c.close(f"{self.desc} tensor {i}", t, want, self.dtype, bound=bound)


def run_batches(c, rng, cases, new_case, settle=lambda: None):
    """Issues `cases` cases in batches of 1-4 in flight, each sync or async, waits for the async
    ones in shuffled order, then `settle()` and checks each. Every rank draws the same stream."""
    i = 0
    while i < cases:
        batch = []
        for _ in range(min(rng.randint(1, 4), cases - i)):
            case = new_case(i)
            async_op = rng.random() < 0.6
            work = case.issue(async_op)
            batch.append((case, work if async_op else None))
            i += 1
        order = list(range(len(batch)))
        rng.shuffle(order)
        for k in order:
            if batch[k][1] is not None:
                batch[k][1].wait()
        settle()
        for case, _ in batch:
            case.check(c)


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    use_test_device()
    seed = int(os.environ.get("MPIGPU_RANDOM_SEED", "1234"))
    cases = int(os.environ.get("MPIGPU_RANDOM_CASES", "300"))
    c = Checker(f"random_ops(np={world}, seed={seed}, cases={cases})")
    rng = random.Random((seed + SEED_OFFSET) * 100 + world)  # the same stream on every rank
    run_batches(c, rng, cases, lambda i: CaseRun(rng, i, rank, world))
    forced = os.environ.get("TORCH_MPIGPU_ALGO")
    import torch_mpi_gpu
    if forced in {a["name"] for a in torch_mpi_gpu._C.algorithms()} and world > 1:
        runs = torch_mpi_gpu._C.algorithm_runs()
        c.true(f"TORCH_MPIGPU_ALGO={forced} ran", runs.get(forced, 0) > 0, str(runs))
    return c.finish()


if __name__ == "__main__":
    run(main)
