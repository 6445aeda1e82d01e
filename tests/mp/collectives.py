"""Every collective x reduce op x dtype x size, in-place and out-of-place, against a reference
computed locally from every rank's (seed, rank)-derived input. Run under mpirun at 1-4 ranks."""

import os

import torch
import torch.distributed as dist

import torch_mpi_gpu

from common import (ALL_DTYPES, FLOAT_DTYPES, ONLY_RANK0_CROWDED, Checker, make_input,
                    reduced, reference_reduce, reduction_bound, run,
                    use_test_device)

# a forced algorithm of ours (a row of the algorithm table, not MPI's own collectives)
OUR_ALGO = os.environ.get("TORCH_MPIGPU_ALGO") if os.environ.get("TORCH_MPIGPU_ALGO") in {
    a["name"] for a in torch_mpi_gpu._C.algorithms()} else None

# MPIGPU_TEST_HOST_PIECES_ON_RANK0=N: rank 0 alone cuts all_reduce/reduce/broadcast into MPI
# calls of N bytes, as a rank whose GPU tensors are staged does; every other rank must cut the
# same pieces (agreed when the group is made), or MPI's collectives see mismatched counts.
HOST_PIECES = os.environ.get("MPIGPU_TEST_HOST_PIECES_ON_RANK0")
if HOST_PIECES and (torch_mpi_gpu.detect_launcher() or {}).get("rank") == 0:
    os.environ["TORCH_MPIGPU_TEST_HOST_PIECE_BYTES"] = HOST_PIECES
# MPIGPU_TEST_NO_SINGLE_COPY_ON_RANK0=1: rank 0 alone fails the single-copy probe, as a rank the
# kernel forbids to read its peers; the whole group must then copy through the slots.
if os.environ.get("MPIGPU_TEST_NO_SINGLE_COPY_ON_RANK0") and \
        (torch_mpi_gpu.detect_launcher() or {}).get("rank") == 0:
    os.environ["TORCH_MPIGPU_TEST_NO_SINGLE_COPY"] = "1"

RED_OPS = {
    "sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR,
}


def valid(op, dtype):
    if op in ("band", "bor", "bxor"):
        return not dtype.is_floating_point
    if op in ("avg", "premul_sum"):
        return dtype.is_floating_point
    return True


def reduce_op(op, factor):
    if op == "premul_sum":
        return dist._make_nccl_premul_sum(factor)
    return RED_OPS[op]


# the sizes of every op x dtype (the reductions' and the data movement's sections)
SIZES = [0, 1, 7, 1000]


class Job:
    """What the sections share: the checker, this rank, the group's size, the test device, and
    the seed every case draws its inputs from (one after another, the same on every rank)."""

    def __init__(self, c, rank, world, device):
        self.c, self.rank, self.world, self.device = c, rank, world, device
        self.seed = 1

    def next_seed(self):
        self.seed += 1
        return self.seed


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = use_test_device()
    c = Checker(f"collectives(np={world}, device={device}, max_elements={os.environ.get('TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL', 'default')})",
                defer_device_reads=True)
    job = Job(c, rank, world, device)
    if ONLY_RANK0_CROWDED:  # (the job got this far: it agreed on its arrivals)
        c.section("ranks that differ in crowding")
        crowding(job)

    c.section("reductions: every op x dtype x size")
    reductions(job)

    c.section("premul_sum with a tensor factor, 2-D tensors")
    premul_sum_tensor_factor(job)

    c.section("complex tensors")
    complex_tensors(job)

    c.section("sparse COO all_reduce")
    sparse_all_reduce(c, rank, world, job.next_seed(), device)

    c.section("all_gather and reduce_scatter with blocks of different sizes")
    uneven_blocks(c, rank, world, job.next_seed())

    c.section("many tensors in one call, coalescing manager")
    many_tensors_in_one_call(job)

    c.section("data movement: every op x dtype x size")
    data_movement(job)

    c.section("non-contiguous tensors, every op")
    noncontiguous_every_op(c, rank, world, job.next_seed())

    c.section("coalesced all_gather_into_tensor / reduce_scatter_tensor")
    coalesced_gather_scatter(job)

    if NEW_SPELLINGS:
        c.section(NEW_SPELLINGS)
        new_spellings(c, rank, world, job.next_seed())

    c.section("collectives in subgroups")
    subgroup_collectives(c, rank, world, job.next_seed())

    c.section("objects and barrier")
    objects_and_barrier(job)
    if os.environ.get("MPIGPU_EXPECT_NODES"):
        # the group's shape as the launcher (or TORCH_MPIGPU_TEST_PRETEND_NODES) laid the ranks out
        c.section("the group's nodes")
        the_groups_nodes(job)
    if HOST_PIECES:
        c.section("one rank's pieces, cut by every rank")
        one_ranks_pieces(job)
    if OUR_ALGO and not os.environ.get("MPIGPU_EXPECT_RAN"):  # else common.py checks that one
        c.section("the forced algorithm ran")
        runs = torch_mpi_gpu._C.algorithm_runs()
        c.true(f"TORCH_MPIGPU_ALGO={OUR_ALGO} ran", runs.get(OUR_ALGO, 0) > 0, str(runs))
    return c.finish()


def crowding(job):
    c, rank = job.c, job.rank
    c.true("only rank 0 waits as crowded", torch_mpi_gpu._C.oversubscribed() == (rank == 0),
           f"oversubscribed() is {torch_mpi_gpu._C.oversubscribed()} on rank {rank}")


def reductions(job):
    """all_reduce / reduce / reduce_scatter_tensor / reduce_scatter, every op x dtype x size."""
    for op in list(RED_OPS) + ["premul_sum"]:
        for dtype in ALL_DTYPES:
            if not valid(op, dtype):
                continue
            kind = "prod" if op == "product" else "any"
            factor = 0.5 if op == "premul_sum" else None
            for n in SIZES:
                seed = job.next_seed()
                all_reduce_and_reduce(job, seed, op, dtype, n, kind, factor)
                reduce_scatters(job, seed, op, dtype, n, kind, factor)


def all_reduce_and_reduce(job, seed, op, dtype, n, kind, factor):
    """One case of the reductions: all_reduce (then async on every other element of a buffer)
    and reduce, against the reference of every rank's input."""
    c, rank, world = job.c, job.rank, job.world
    inputs = [make_input(seed, r, n, dtype, kind) for r in range(world)]
    expected = reference_reduce(op, inputs, dtype, factor)
    bound = reduction_bound(op, inputs, dtype, factor)
    case = f"all_reduce {op} {dtype} n={n}"
    t = inputs[rank].clone()
    dist.all_reduce(t, op=reduce_op(op, factor))
    c.close(case, t, expected, dtype, bound=bound)
    if OUR_ALGO and n > 0 and world > 1:
        # our algorithms promise the same bits on every rank (DDP relies on it)
        rows = torch.empty(world, t.numel() * t.element_size(), dtype=torch.uint8)
        dist.all_gather_into_tensor(rows, t.view(torch.uint8).reshape(-1))
        c.close(case + " bitwise identical on every rank", rows, rows[0].expand_as(rows))

    # async + non-contiguous (every other element of a 2n buffer)
    base = torch.zeros(2 * n, dtype=dtype)
    view = base[::2]
    view.copy_(inputs[rank])
    w = dist.all_reduce(view, op=reduce_op(op, factor), async_op=True)
    w.wait()
    c.close(case + " non-contiguous async", view, expected, dtype, bound=bound)
    c.close(case + " non-contiguous keeps gaps", base[1::2], torch.zeros_like(base[1::2]))

    root = (seed % world)
    t = inputs[rank].clone()
    dist.reduce(t, dst=root, op=reduce_op(op, factor))
    if rank == root:
        c.close(f"reduce {op} {dtype} n={n} root={root}", t, expected, dtype,
                bound=bound)
    else:
        c.close(f"reduce {op} {dtype} n={n} non-root unchanged", t, inputs[rank])


def reduce_scatters(job, seed, op, dtype, n, kind, factor):
    """One case of the reductions: reduce_scatter_tensor and reduce_scatter of inputs of
    world * n elements."""
    c, rank, world = job.c, job.rank, job.world
    big = [make_input(seed + 10_000, r, world * n, dtype, kind) for r in range(world)]
    full = reference_reduce(op, big, dtype, factor)
    full_bound = reduction_bound(op, big, dtype, factor)
    mine = slice(rank * n, (rank + 1) * n)
    out = torch.empty(n, dtype=dtype)
    dist.reduce_scatter_tensor(out, big[rank].clone(), op=reduce_op(op, factor))
    c.close(f"reduce_scatter_tensor {op} {dtype} n={n}", out, full[mine], dtype,
            bound=full_bound[mine] if full_bound is not None else None)
    out = torch.empty(n, dtype=dtype)
    dist.reduce_scatter(out, list(big[rank].clone().chunk(world)) if n else
                        [torch.empty(0, dtype=dtype) for _ in range(world)],
                        op=reduce_op(op, factor))
    c.close(f"reduce_scatter {op} {dtype} n={n}", out, full[mine], dtype,
            bound=full_bound[mine] if full_bound is not None else None)


def premul_sum_tensor_factor(job):
    """PREMUL_SUM with a tensor factor, and on 2-D tensors."""
    c, rank, world = job.c, job.rank, job.world
    for dtype in FLOAT_DTYPES:
        seed = job.next_seed()
        inputs = [make_input(seed, r, 12, dtype).reshape(3, 4) for r in range(world)]
        factor = torch.tensor([0.25], dtype=dtype)
        t = inputs[rank].clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        c.close(f"all_reduce premul_sum tensor-factor {dtype}", t,
                reference_reduce("premul_sum", inputs, dtype, 0.25), dtype,
                bound=reduction_bound("premul_sum", inputs, dtype, 0.25))


def complex_tensors(job):
    """Complex all_reduce (torch passes SUM/AVG as view_as_real) and broadcast."""
    c, rank, world = job.c, job.rank, job.world
    for dtype in (torch.complex64, torch.complex128):
        seed = job.next_seed()
        inputs = [torch.complex(make_input(seed, r, 5, torch.float64),
                                make_input(seed + 1, r, 5, torch.float64)).to(dtype)
                  for r in range(world)]
        t = inputs[rank].clone()
        dist.all_reduce(t)
        parts = [torch.view_as_real(i) for i in inputs]
        c.close(f"all_reduce sum {dtype}", torch.view_as_real(t),
                reference_reduce("sum", parts, parts[0].dtype).to(parts[0].dtype),
                parts[0].dtype, bound=reduction_bound("sum", parts, parts[0].dtype))
        t = inputs[0].clone() if rank == 0 else torch.zeros(5, dtype=dtype)
        dist.broadcast(t, src=0)
        c.close(f"broadcast {dtype}", torch.view_as_real(t), torch.view_as_real(inputs[0]))


def many_tensors_in_one_call(job):
    """Many tensors in one call, mixed dtypes (grouped by dtype, one MPI call per dtype), and the
    coalescing manager's all_reduces in one call."""
    c, rank, world = job.c, job.rank, job.world
    seed = job.next_seed()
    mixed = [make_input(seed, 0, 3, torch.float32), make_input(seed, 0, 4, torch.int64),
             make_input(seed, 1, 5, torch.float32), make_input(seed, 2, 0, torch.float64)]
    per_rank = [[make_input(seed + i, r, m.numel(), m.dtype) for i, m in enumerate(mixed)]
                for r in range(world)]
    mine = [x.clone() for x in per_rank[rank]]
    # torch's Python wrapper insists on one dtype; the backend groups mixed dtypes itself.
    pg = dist.distributed_c10d._get_default_group()
    pg.allreduce_coalesced(mine, dist.AllreduceCoalescedOptions()).wait()
    same = [x.clone() for x in per_rank[rank] if x.dtype == torch.float32]
    dist.all_reduce_coalesced(same)
    def summed(i, dtype):  # (expected, bound) of the sum of every rank's tensor i
        ins = [per_rank[r][i] for r in range(world)]
        return reference_reduce("sum", ins, dtype), reduction_bound("sum", ins, dtype)

    want, bound = summed(2, torch.float32)
    c.close("all_reduce_coalesced one dtype", same[1], want, torch.float32, bound=bound)
    for i, m in enumerate(mine):
        want, bound = summed(i, m.dtype)
        c.close(f"all_reduce_coalesced tensor {i} {m.dtype}", m, want, m.dtype, bound=bound)
    before, ours_before = torch_mpi_gpu_calls(), sum(torch_mpi_gpu._C.algorithm_runs().values())
    with dist._coalescing_manager(async_ops=True) as cm:
        parts = [x.clone() for x in per_rank[rank] if x.dtype == torch.float32]
        for p in parts:
            dist.all_reduce(p)
    cm.wait()
    # one run of our algorithm, or MPI's own call (split where MAX_ELEMENTS_PER_CALL is small)
    ours = sum(torch_mpi_gpu._C.algorithm_runs().values()) > ours_before
    c.true("coalescing manager: one MPI call for one dtype",
           torch_mpi_gpu_calls() - before == (1 if ours else chunks(8)),
           f"{torch_mpi_gpu_calls() - before} calls")
    for j, i in enumerate((0, 2)):
        want, bound = summed(i, torch.float32)
        c.close(f"coalescing manager all_reduce {j}", parts[j], want, torch.float32, bound=bound)


def movement_input(seed, r, m, dtype):
    """Input r of m elements of the data movement's cases (complex ones drawn as float pairs)."""
    if not dtype.is_complex:
        return make_input(seed, r, m, dtype)
    return torch.view_as_complex(make_input(seed, r, 2 * m, torch.float32).reshape(m, 2))


def data_movement(job):
    """Every data movement op x dtype x size (+ complex via torch); where the node algorithm is
    forced, that it moved the data."""
    node_runs_before = torch_mpi_gpu._C.algorithm_runs().get("node", 0)
    for dtype in ALL_DTYPES + [torch.complex64]:
        for n in SIZES:
            seed = job.next_seed()
            broadcast_gather_scatter(job, seed, dtype, n)
            all_to_alls(job, seed, dtype, n)

    described = dist.group.WORLD._get_backend(torch.device("cpu")).describe()
    if OUR_ALGO == "node" and "shared memory" in described and "unavailable" not in described:
        # broadcast, all_gather, and all_gather_into_tensor twice, per case, whatever the
        # nodes' counts; none of the others
        moved = torch_mpi_gpu._C.algorithm_runs().get("node", 0) - node_runs_before
        dtypes = len(ALL_DTYPES) + 1
        cases = dtypes * len(SIZES)
        want = 4 * cases
        job.c.true("the node algorithm moved the data", moved == want,
                   f"{moved} node runs for {cases} cases (want {want}): {described}")


def broadcast_gather_scatter(job, seed, dtype, n):
    """One case of the data movement: broadcast, all_gather (list and tensor), gather, scatter."""
    c, rank, world = job.c, job.rank, job.world
    inputs = [movement_input(seed, r, n, dtype) for r in range(world)]
    root = seed % world
    tag = f"{dtype} n={n}"

    t = inputs[rank].clone() if rank == root else torch.zeros_like(inputs[rank])
    dist.broadcast(t, src=root)
    c.close(f"broadcast {tag} root={root}", t, inputs[root])

    outs = [torch.empty_like(inputs[0]) for _ in range(world)]
    dist.all_gather(outs, inputs[rank])
    for r in range(world):
        c.close(f"all_gather {tag} from {r}", outs[r], inputs[r])

    out = torch.empty(world * n, dtype=dtype)
    dist.all_gather_into_tensor(out, inputs[rank])
    c.close(f"all_gather_into_tensor {tag}", out, torch.cat(inputs))
    out2 = torch.empty(world, n, dtype=dtype)
    dist.all_gather_into_tensor(out2, inputs[rank])  # 2-D output (stacked)
    c.close(f"all_gather_into_tensor stacked {tag}", out2, torch.stack(inputs))

    gl = [torch.empty_like(inputs[0]) for _ in range(world)] if rank == root else None
    dist.gather(inputs[rank], gather_list=gl, dst=root)
    if rank == root:
        for r in range(world):
            c.close(f"gather {tag} from {r}", gl[r], inputs[r])

    sl = [movement_input(seed, 100 + r, n, dtype) for r in range(world)]
    out = torch.empty_like(inputs[0])
    dist.scatter(out, scatter_list=sl if rank == root else None, src=root)
    c.close(f"scatter {tag}", out, sl[rank])


def all_to_alls(job, seed, dtype, n):
    """One case of the data movement: all_to_all (lists, uneven sizes) and all_to_all_single
    (even and uneven splits), then each with its input and output aliased."""
    c, rank, world = job.c, job.rank, job.world
    tag = f"{dtype} n={n}"

    def block(src, dst, m):
        return movement_input(seed + 7, src * 31 + dst, m, dtype)
    send_sizes = lambda src, dst: (src + 2 * dst + n) % 4  # noqa: E731
    ins = [block(rank, d, send_sizes(rank, d)) for d in range(world)]
    outs = [torch.empty(send_sizes(s, rank), dtype=dtype) for s in range(world)]
    dist.all_to_all(outs, ins)
    for s in range(world):
        c.close(f"all_to_all {tag} from {s}", outs[s], block(s, rank, send_sizes(s, rank)))

    rows = 2
    even_in = torch.cat([block(rank, d, n * rows) for d in range(world)]).reshape(-1, rows) \
        if n else torch.empty(0, rows, dtype=dtype)
    even_out = torch.empty_like(even_in)
    dist.all_to_all_single(even_out, even_in)
    c.close(f"all_to_all_single even {tag}", even_out.flatten(),
            torch.cat([block(s, rank, n * rows) for s in range(world)]) if n else
            torch.empty(0, dtype=dtype))

    in_splits = [send_sizes(rank, d) for d in range(world)]
    out_splits = [send_sizes(s, rank) for s in range(world)]
    un_in = torch.cat([block(rank, d, in_splits[d] * rows) for d in range(world)]).reshape(-1, rows)
    un_out = torch.empty(sum(out_splits), rows, dtype=dtype)
    dist.all_to_all_single(un_out, un_in, out_splits, in_splits)
    c.close(f"all_to_all_single uneven {tag}", un_out.flatten(),
            torch.cat([block(s, rank, out_splits[s] * rows) for s in range(world)]))

    # one tensor as input and output, and views of one buffer as both lists: the standard
    # forbids aliased buffers (Open MPI at 3 and 4 ranks returned overwritten blocks)
    same = even_in.clone()
    dist.all_to_all_single(same, same)
    c.close(f"all_to_all_single in place {tag}", same.flatten(),
            torch.cat([block(s, rank, n * rows) for s in range(world)]) if n else
            torch.empty(0, dtype=dtype))
    views = list(torch.cat([block(rank, d, n) for d in range(world)]).split(n)) if n else \
        [torch.empty(0, dtype=dtype) for _ in range(world)]
    dist.all_to_all(views, views)
    for s in range(world):
        c.close(f"all_to_all in place {tag} from {s}", views[s], block(s, rank, n))


def coalesced_gather_scatter(job):
    """Coalesced all_gather_into_tensor / reduce_scatter_tensor (FSDP's calls), the output inside
    the input, then the buffers inside one another."""
    c, rank, world = job.c, job.rank, job.world
    seed = job.next_seed()
    ins = [make_input(seed, rank, 6, torch.float32), make_input(seed, rank, 3, torch.bfloat16)]
    outs = [torch.empty(world * 6), torch.empty(world * 3, dtype=torch.bfloat16)]
    with dist._coalescing_manager(async_ops=False):
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    c.close("coalesced all_gather_into_tensor fp32", outs[0],
            torch.cat([make_input(seed, r, 6, torch.float32) for r in range(world)]))
    c.close("coalesced all_gather_into_tensor bf16", outs[1],
            torch.cat([make_input(seed, r, 3, torch.bfloat16) for r in range(world)]))
    big = [make_input(seed + 1, r, world * 4, torch.float32) for r in range(world)]
    out = torch.empty(4)
    with dist._coalescing_manager(async_ops=False):
        dist.reduce_scatter_tensor(out, big[rank].clone(), op=dist.ReduceOp.AVG)
    mine = slice(rank * 4, (rank + 1) * 4)
    c.close("coalesced reduce_scatter_tensor avg", out,
            reference_reduce("avg", big, torch.float32)[mine], torch.float32,
            bound=reduction_bound("avg", big, torch.float32)[mine])
    # the output inside the input, at the rank's own slice (FSDP's layout): MPI_IN_PLACE
    for op in ("sum", "avg"):
        inside = big[rank].clone()
        dist.reduce_scatter_tensor(inside[mine], inside, op=RED_OPS[op])
        c.close(f"reduce_scatter_tensor {op}, output inside the input", inside[mine],
                reference_reduce(op, big, torch.float32)[mine], torch.float32,
                bound=reduction_bound(op, big, torch.float32)[mine])
    buffers_inside_one_another(job, seed)


def buffers_inside_one_another(job, seed):
    """all_gather_into_tensor's input inside its output, reduce_scatter_tensor's output inside its
    input at another rank's block, and a rank's own tensor inside the list of gather, scatter and
    all_gather."""
    c, rank, world = job.c, job.rank, job.world
    # the input inside the output, at the rank's own row (in place) and at another rank's (the
    # node path's single copy read peers' rows into the output over that input until it copied
    # it first), 1 MiB per rank: above the single copy threshold, and long enough to read that a
    # peer reads this rank's input while it is overwritten
    m = 1 << 18
    rows = [make_input(seed + 2, r, m, torch.float32) for r in range(world)]
    for k, where in {rank: "its own row", (rank + 1) % world: "another rank's row"}.items():
        gathered = torch.zeros(world * m)
        gathered[k * m:(k + 1) * m] = rows[rank]
        dist.all_gather_into_tensor(gathered, gathered[k * m:(k + 1) * m])
        c.close(f"all_gather_into_tensor, input inside the output at {where}", gathered,
                torch.cat(rows))
        # and the reverse: reduce_scatter_tensor's output inside its input at another block
        if k != rank:
            inside = torch.cat([rows[q] + rank for q in range(world)])
            dist.reduce_scatter_tensor(inside[k * m:(k + 1) * m], inside)
            blocks = [rows[rank] + q for q in range(world)]  # every rank's block `rank`
            c.close("reduce_scatter_tensor, output inside the input at another rank's block",
                    inside[k * m:(k + 1) * m], reference_reduce("sum", blocks, torch.float32),
                    torch.float32, bound=reduction_bound("sum", blocks, torch.float32))
    # a rank's own tensor inside the list of gather, scatter and all_gather
    own = rows[rank][:1000].clone()
    listed = [own if q == rank else torch.zeros(1000) for q in range(world)]
    dist.gather(own, listed if rank == 0 else None, dst=0)
    if rank == 0:
        c.close("gather, the root's input in its list", torch.cat(listed),
                torch.cat([rows[q][:1000] for q in range(world)]))
    listed = [own if q == rank else torch.zeros(1000) for q in range(world)]
    dist.all_gather(listed, own)
    c.close("all_gather, the input in the output list", torch.cat(listed),
            torch.cat([rows[q][:1000] for q in range(world)]))
    scattered = [rows[q][:1000].clone() for q in range(world)]
    mine_out = scattered[0] if rank == 0 else torch.zeros(1000)
    dist.scatter(mine_out, scattered if rank == 0 else None, src=0)
    c.close("scatter, the root's output in its list", mine_out, rows[rank][:1000])


def objects_and_barrier(job):
    c, rank, world = job.c, job.rank, job.world
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "payload": "x" * rank})
    c.true("all_gather_object", objs == [{"rank": r, "payload": "x" * r} for r in range(world)], str(objs))
    lst = [f"from {0}", 3] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    c.true("broadcast_object_list", lst == ["from 0", 3], str(lst))
    dist.barrier()


def the_groups_nodes(job):
    """The group's description names the nodes (MPIGPU_EXPECT_NODES), and what the MPIGPU_EXPECT_*
    variables given name: the device slots, their ordering, the leader form, single copy."""
    c = job.c
    described = dist.group.WORLD._get_backend(torch.device("cpu")).describe()
    want = "nodes: " + os.environ["MPIGPU_EXPECT_NODES"]
    c.true("the description names them", want in described, f"want {want!r} in {described}")
    waits = torch_mpi_gpu._C.node_waits()  # the benchmark's columns: barriers, and their time
    c.true("host barriers were waited at, and timed", waits["host"] + waits["device"] > 0 and
           (waits["host"] > 0) == (waits["barrier_us"] > 0), str(waits))
    if os.environ.get("TORCH_MPIGPU_TEST_DEVICE_SLOTS") == "1":
        want = os.environ.get("MPIGPU_EXPECT_SLOTS", "device slots 4096 bytes per rank and half")
        c.true("the ops ran in device slots (made, not unavailable)",
               want in described and "made at the first node op" not in described,
               f"want {want!r} in {described}")
    if os.environ.get("MPIGPU_EXPECT_ORDER"):  # how the device slots' ranks wait
        c.true("the device slots' ordering", os.environ["MPIGPU_EXPECT_ORDER"] in described,
               described)
    if os.environ.get("MPIGPU_EXPECT_LEADER"):  # who reduces on one node (NODE_LEADER)
        leader = os.environ["MPIGPU_EXPECT_LEADER"] != "0"
        c.true("the leader form" if leader else "no leader form",
               ("the leader form" in described) == leader, described)
    if os.environ.get("MPIGPU_EXPECT_SINGLE_COPY"):
        c.true("single copy as the group agreed", os.environ["MPIGPU_EXPECT_SINGLE_COPY"] in described,
               described)
    if os.environ.get("MPIGPU_EXPECT_SINGLE_COPY_READS"):  # some / none
        reads = torch_mpi_gpu._C.node_waits()["single_copy_reads"]
        some = os.environ["MPIGPU_EXPECT_SINGLE_COPY_READS"] == "some"
        c.true("all_gather read the peers in place" if some else "all_gather copied through the slots", (reads > 0) == some,
               f"{reads} single-copy reads: {described}")


def one_ranks_pieces(job):
    """Rank 0's pieces (HOST_PIECES) in every rank's description; under MPI's own, one MPI call
    per piece."""
    c, rank, world = job.c, job.rank, job.world
    described = dist.group.WORLD._get_backend(torch.device("cpu")).describe()
    want = f"cuts broadcast into MPI calls of {HOST_PIECES} bytes and all_reduce/reduce by MPI's own into {HOST_PIECES} bytes"
    c.true("the description says so on every rank", want in described, described)
    if os.environ.get("TORCH_MPIGPU_ALGO") == "mpi":  # MPI's own: one call per piece
        for what, dtype, n in (("all_reduce", torch.float32, 100), ("reduce", torch.int8, 7),
                               ("broadcast", torch.float64, 100), ("broadcast", torch.int16, 13)):
            t = torch.ones(n, dtype=dtype)
            before = torch_mpi_gpu_calls()
            {"all_reduce": lambda: dist.all_reduce(t), "reduce": lambda: dist.reduce(t, dst=world - 1),
             "broadcast": lambda: dist.broadcast(t, src=world - 1)}[what]()
            calls = torch_mpi_gpu_calls() - before
            c.true(f"{what} {dtype} n={n}: MPI calls, one per piece",
                   calls == chunks(n, t.element_size()), f"{calls} calls, want {chunks(n, t.element_size())}")
            c.true(f"{what} {dtype} n={n}: right", bool((t == (world if what != "broadcast" and
                   (what == "all_reduce" or rank == world - 1) else 1)).all()), str(t))



def uneven_blocks(c, rank, world, seed):
    """all_gather whose ranks' inputs differ in size (torch allows it) and reduce_scatter whose
    blocks do (NCCL allows it), against references built from every rank's input; a rank's
    block may be empty."""
    def count(r, n):  # rank r's block: some empty, some above MAX_ELEMENTS_PER_CALL=5
        return (n * (r + 1) + 3 * r) % (4 * n + 1) if n else r % 2
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.float64):
        for n in (0, 1, 7):
            seed += 1
            tag = f"{dtype} n={n}"
            inputs = [make_input(seed, r, count(r, n), dtype) for r in range(world)]
            outs = [torch.full((count(r, n),), 7, dtype=dtype) for r in range(world)]
            dist.all_gather(outs, inputs[rank])
            for r in range(world):
                c.close(f"uneven all_gather {tag} from {r}", outs[r], inputs[r])
            # views of one buffer, this rank's input its own block (MPI_IN_PLACE), async
            flat = torch.zeros(sum(count(r, n) for r in range(world)), dtype=dtype)
            views = list(flat.split([count(r, n) for r in range(world)]))
            views[rank].copy_(inputs[rank])
            dist.all_gather(views, views[rank], async_op=True).wait()
            c.close(f"uneven all_gather {tag} in place, async", flat, torch.cat(inputs))
            ops = ("sum", "max") + (("avg", "premul_sum") if dtype.is_floating_point else ())
            for op in ops:
                factor = 0.5 if op == "premul_sum" else None
                blocks = [[make_input(seed + 50 + q, r, count(q, n), dtype) for q in range(world)]
                          for r in range(world)]  # blocks[r][q]: rank r's input block for rank q
                mine = [blocks[r][rank] for r in range(world)]
                out = torch.full((count(rank, n),), 3, dtype=dtype)
                dist.reduce_scatter(out, [b.clone() for b in blocks[rank]], op=reduce_op(op, factor))
                c.close(f"uneven reduce_scatter {op} {tag}", out,
                        reference_reduce(op, mine, dtype, factor), dtype,
                        bound=reduction_bound(op, mine, dtype, factor))
    # a rank's own block must have its tensor's size: refused at the call (here on every rank)
    c.raises("all_gather: own output block of another size than the input refused", ValueError,
             lambda: dist.all_gather([torch.empty(2) for _ in range(world)], torch.empty(3)),
             ("allgather", f"rank {rank}", f"output {rank} (this rank's own block) has 2"))
    c.raises("reduce_scatter: own input block of another size than the output refused", ValueError,
             lambda: dist.reduce_scatter(torch.empty(3), [torch.empty(2) for _ in range(world)]),
             ("reduce_scatter", f"rank {rank}", f"input {rank} (this rank's own block) has 2"))


def sparse_coo(seed, r, size, sparse_dim, dtype, device):
    """Rank r's sparse tensor: a few entries (none on rank 0), some at the same index twice (not
    coalesced), small integer values so every sum is exact in every dtype."""
    g = torch.Generator().manual_seed(seed * 31 + r)
    nnz = 2 * r + (r > 0)
    # drawn on the host (the generator's device) whatever the default device (CUDA on GPU runs)
    idx = torch.stack([torch.randint(0, size[d], (nnz,), generator=g, device="cpu") for d in range(sparse_dim)])
    if nnz > 1:
        idx[:, -1] = idx[:, 0]  # a duplicate entry
    vals = torch.randint(-3, 4, (nnz, *size[sparse_dim:]), generator=g, device="cpu").to(dtype)
    return torch.sparse_coo_tensor(idx, vals, size, device="cpu", check_invariants=True).to(device)


def sparse_all_reduce(c, rank, world, seed, device):
    """Sparse COO tensors (DDP's sparse embedding gradients), reduced by SUM and AVG, against the
    dense sum of every rank's tensor; then the errors."""
    # torch has no sparse kernels for the tests' own device: its ranks use CPU sparse tensors
    # (in one group with the other ranks' devices)
    dev = device if device.type in ("cpu", "cuda") else torch.device("cpu")
    shapes = [((10,), 1), ((6, 3), 1), ((4, 5), 2), ((3, 2, 2), 2)]
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int8):
        for size, sparse_dim in shapes:
            seed += 1
            inputs = [sparse_coo(seed, r, size, sparse_dim, dtype, "cpu") for r in range(world)]
            dense = sum(i.to_dense().to(torch.float64) for i in inputs)
            case = f"sparse all_reduce sum {dtype} {size} sparse_dim={sparse_dim}"
            t = inputs[rank].to(dev, copy=True)  # the input stays as it was
            dist.all_reduce(t)
            c.true(case + " sparse, coalesced, on its device",
                   t.is_sparse and t.is_coalesced() and t.device == dev, f"{t.layout} {t.device}")
            c.close(case, t.to_dense(), dense.to(dtype))
            if dtype.is_floating_point:
                t = inputs[rank].to(dev, copy=True)  # the input stays as it was
                work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
                got = work.get_future().wait()[0]
                c.close(case.replace("sum", "avg async"), got.to_dense(), (dense / world).to(dtype),
                        world=world)
                c.true(case + " avg: the future holds the caller's tensor", got is t)
    # two tensors in one call (the process group's list form; torch has no sparse
    # all_reduce_coalesced): each reduced on its own
    seed += 1
    a = [sparse_coo(seed, r, (8,), 1, torch.float32, "cpu") for r in range(world)]
    b = [sparse_coo(seed + 1, r, (5, 2), 1, torch.float32, "cpu") for r in range(world)]
    ts = [a[rank].to(dev, copy=True), b[rank].to(dev, copy=True)]
    dist.group.WORLD.allreduce(ts).wait()
    c.close("sparse all_reduce of two tensors, first", ts[0].to_dense(), sum(x.to_dense() for x in a))
    c.close("sparse all_reduce of two tensors, second", ts[1].to_dense(), sum(x.to_dense() for x in b))
    one = sparse_coo(seed, rank, (8,), 1, torch.float32, dev)
    c.raises("sparse all_reduce MAX refused", TypeError,
             lambda: dist.all_reduce(one, op=dist.ReduceOp.MAX), ("allreduce", f"rank {rank}", "SUM or AVG"))
    c.raises("sparse all_reduce of bool refused", TypeError,
             lambda: dist.all_reduce(torch.sparse_coo_tensor([[0]], [True], (3,), device=dev)),
             ("allreduce", "uint8"))
    if world > 1:
        # every rank learns of the mismatch (the same table everywhere), none hangs
        odd = sparse_coo(seed, rank, (8 + (rank == world - 1),), 1, torch.float32, dev)
        c.raises("sparse all_reduce of differing sizes refused on every rank", ValueError,
                 lambda: dist.all_reduce(odd), ("allreduce", f"rank {rank}", "differ between ranks", "[9]"))
    t = sparse_coo(seed, rank, (8,), 1, torch.float32, dev)
    dist.all_reduce(t)
    c.close("sparse all_reduce after the errors", t.to_dense(),
            sum(sparse_coo(seed, r, (8,), 1, torch.float32, "cpu").to_dense() for r in range(world)))


def subgroup_collectives(c, rank, world, seed):
    """all_reduce, reduce_scatter, broadcast and all_gather in subgroups: each half of the ranks (inside one node where
    nodes are consecutive blocks) and the even and odd ranks (across nodes); sizes below and
    above the node algorithm's one-shot limit and its pieces."""
    half = (world + 1) // 2
    for name, members in (("first half", list(range(half))), ("second half", list(range(half, world))),
                          ("even ranks", list(range(0, world, 2))), ("odd ranks", list(range(1, world, 2)))):
        if not members:
            continue
        group = dist.new_group(members)  # every rank, in the same order
        if rank not in members:
            continue
        me, k = members.index(rank), len(members)
        for n in (1, 1000, 20000):  # 20000 floats: above the one-shot limit
            seed += 1
            inputs = [make_input(seed, r, n, torch.float32) for r in members]
            t = inputs[me].clone()
            dist.all_reduce(t, group=group)
            want, bound = reduced("sum", inputs, torch.float32)
            c.close(f"{name} all_reduce n={n}", t, want, torch.float32, bound=bound)
            big = [make_input(seed + 1, r, k * n, torch.float32) for r in members]
            out = torch.empty(n)
            dist.reduce_scatter_tensor(out, big[me].clone(), group=group)
            want, bound = reduced("sum", big, torch.float32)
            mine = slice(me * n, (me + 1) * n)
            c.close(f"{name} reduce_scatter n={n}", out, want[mine], torch.float32, bound=bound[mine])
            root = members[seed % k]  # a global rank, as torch's group calls take
            b = inputs[me].clone() if rank == root else torch.zeros(n)
            dist.broadcast(b, src=root, group=group)
            c.close(f"{name} broadcast n={n} from {root}", b, inputs[members.index(root)])
            gathered = torch.empty(k * n)
            dist.all_gather_into_tensor(gathered, inputs[me], group=group)
            c.close(f"{name} all_gather n={n}", gathered, torch.cat(inputs))


# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (the old names warn); both
# spellings are tested where torch has the new one (the old one: every section above)
NEW_SPELLINGS = "all_gather_single / reduce_scatter_single" if hasattr(
    dist, "all_gather_single") else None


def new_spellings(c, rank, world, seed):
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (0, 1, 7, 1000):
            seed += 1
            inputs = [make_input(seed, r, n, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype)
            dist.all_gather_single(out, inputs[rank])
            c.close(f"all_gather_single {dtype} n={n}", out, torch.cat(inputs))
            stacked = torch.empty(world, n, dtype=dtype)
            dist.all_gather_single(stacked, inputs[rank], async_op=True).wait()
            c.close(f"all_gather_single stacked, async {dtype} n={n}", stacked,
                    torch.stack(inputs))
            big = [make_input(seed + 1, r, world * n, dtype) for r in range(world)]
            mine = slice(rank * n, (rank + 1) * n)
            for op in ("sum", "avg") if dtype.is_floating_point else ("sum",):
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_single(out, big[rank].clone(), op=RED_OPS[op])
                want, bound = reduced(op, big, dtype)
                c.close(f"reduce_scatter_single {op} {dtype} n={n}", out, want[mine], dtype,
                        bound=bound[mine] if bound is not None else None)


def noncontiguous_every_op(c, rank, world, seed, n=7):
    """Every op with strided tensors (every other element of a zeroed buffer) as inputs and
    outputs: results right, and the gaps between the elements untouched."""
    dtype = torch.float32
    views = []

    def strided(src=None, m=n):
        base = torch.zeros(2 * m, dtype=dtype)
        view = base[::2]
        if src is not None:
            view.copy_(src)
        views.append((base, view))
        return view

    inputs = [make_input(seed, r, n, dtype) for r in range(world)]
    root = seed % world
    t = strided(inputs[rank] if rank == root else None)
    dist.broadcast(t, src=root)
    c.close("broadcast", t, inputs[root])

    outs = [strided() for _ in range(world)]
    dist.all_gather(outs, strided(inputs[rank]))
    for r in range(world):
        c.close(f"all_gather from {r}", outs[r], inputs[r])

    gl = [strided() for _ in range(world)] if rank == root else None
    dist.gather(strided(inputs[rank]), gather_list=gl, dst=root)
    for r in range(world if rank == root else 0):
        c.close(f"gather from {r}", gl[r], inputs[r])

    out = strided()
    dist.scatter(out, scatter_list=[strided(x) for x in inputs] if rank == root else None, src=root)
    c.close("scatter", out, inputs[rank])

    blocks = [[make_input(seed + 1, s * 31 + d, n, dtype) for d in range(world)] for s in range(world)]
    outs = [strided() for _ in range(world)]
    dist.all_to_all(outs, [strided(b) for b in blocks[rank]])
    for s in range(world):
        c.close(f"all_to_all from {s}", outs[s], blocks[s][rank])

    want, bound = reduced("sum", inputs, dtype)
    t = strided(inputs[rank])
    dist.reduce(t, dst=root)
    c.close("reduce", t, want if rank == root else inputs[rank], dtype,
            bound=bound if rank == root else None)

    big = [make_input(seed + 2, r, world * n, dtype) for r in range(world)]
    want, bound = reduced("sum", big, dtype)
    mine = slice(rank * n, (rank + 1) * n)
    out = strided()
    dist.reduce_scatter(out, [strided(x) for x in big[rank].chunk(world)])
    c.close("reduce_scatter", out, want[mine], dtype, bound=bound[mine])

    t = strided(inputs[rank])
    dist.all_reduce(t)
    want, bound = reduced("sum", inputs, dtype)
    c.close("all_reduce", t, want, dtype, bound=bound)
    c.true("the gaps between the elements are untouched",
           all(bool((base[1::2] == 0).all()) for base, _ in views))


def torch_mpi_gpu_calls():
    # MPI collective calls, plus runs of our own algorithms (TORCH_MPIGPU_ALGO): one per bucket
    return torch_mpi_gpu._C.mpi_call_count() + sum(torch_mpi_gpu._C.algorithm_runs().values())


def chunks(numel, itemsize=4):
    """MPI calls of an all_reduce/reduce/broadcast by MPI's own: one per piece of the group's cut
    (HOST_PIECES), each split where MAX_ELEMENTS_PER_CALL is small."""
    limit = int(os.environ.get("TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL", 2**31 - 1))
    per = max(1, int(HOST_PIECES) // itemsize) if HOST_PIECES else max(numel, 1)
    pieces = [min(per, numel - off) for off in range(0, numel, per)] or [0]
    return sum(max(1, -(-n // limit)) for n in pieces)


if __name__ == "__main__":
    run(main)
