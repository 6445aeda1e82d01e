"""Bad arguments raise ValueError/TypeError naming the op and the rank, on every rank alike, and
the group keeps working afterwards. Run under mpirun at 1-4 ranks."""

import torch
import torch.distributed as dist

from common import Checker, run

# The sections every rank reports (tests/test_multirank.py reads them from here)
(OP_DTYPE, SIZES_ROOTS_LISTS, TENSOR_KINDS, P2P_PEERS_TAGS, BACKEND_CHECKS, AFTER_DESTROY,
 COALESCING_BLOCK, WORKS_AFTER) = SECTIONS = (
    "reduce op x dtype refused", "sizes, roots and lists refused", "tensor kinds refused",
    "point-to-point peers and tags refused", "the backend's own checks", "use after destroy refused",
    "a coalescing block that raised does not hold the group", "the group works after the errors")


class Job:
    """What the sections share: the checker, the default group, this rank, the group's size, the
    rank's prefix in the messages, and a float and an int32 tensor of ones."""

    def __init__(self, c, pg, rank, world):
        self.c, self.pg, self.rank, self.world = c, pg, rank, world
        self.who = f"[rank {rank}]"
        self.f, self.i = torch.ones(4), torch.ones(4, dtype=torch.int32)


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"errors(np={world})")
    job = Job(c, dist.distributed_c10d._get_default_group(), rank, world)

    c.section(OP_DTYPE)
    op_dtype_refused(job)
    c.section(SIZES_ROOTS_LISTS)
    sizes_roots_lists_refused(job)
    c.section(TENSOR_KINDS)
    tensor_kinds_refused(job)
    c.section(P2P_PEERS_TAGS)
    p2p_peers_tags_refused(job)
    c.section(SIZES_ROOTS_LISTS)
    gather_list_on_non_root_refused(job)

    c.section(BACKEND_CHECKS)
    backend_checks(job)
    c.section(AFTER_DESTROY)
    use_after_destroy_refused(job)

    c.section(COALESCING_BLOCK)
    coalescing_block_that_raised(job)

    c.section(WORKS_AFTER)
    works_after(job)
    return c.finish()


def op_dtype_refused(job):
    c, pg, world, who, f, i = job.c, job.pg, job.world, job.who, job.f, job.i
    c.raises("BXOR on float", TypeError, lambda: dist.all_reduce(f.clone(), op=dist.ReduceOp.BXOR),
             ("mpigpu allreduce", who, "BXOR", "Float"))
    c.raises("AVG on int", TypeError, lambda: dist.all_reduce(i.clone(), op=dist.ReduceOp.AVG),
             ("allreduce", who, "AVG"))
    c.raises("PREMUL_SUM on int", TypeError,
             lambda: dist.all_reduce(i.clone(), op=dist._make_nccl_premul_sum(2.0)),
             ("allreduce", who, "PREMUL_SUM"))
    c.raises("MAX on complex", TypeError,
             lambda: pg.allreduce([torch.ones(2, dtype=torch.complex64)], _opts(dist.ReduceOp.MAX)),
             ("allreduce", who, "MAX"))
    c.raises("reduce_scatter BOR on bfloat16", TypeError,
             lambda: dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.bfloat16),
                                                torch.ones(2 * world, dtype=torch.bfloat16),
                                                op=dist.ReduceOp.BOR),
             ("reduce_scatter_tensor", who, "BOR"))


def sizes_roots_lists_refused(job):
    c, pg, rank, world, who, f = job.c, job.pg, job.rank, job.world, job.who, job.f
    bo = dist.BroadcastOptions()
    bo.rootRank = world + 3
    c.raises("broadcast root out of range", ValueError, lambda: pg.broadcast([f.clone()], bo),
             ("broadcast", who, "root", "out of range"))
    c.raises("all_gather_into_tensor output too small", ValueError,
             lambda: dist.all_gather_into_tensor(torch.empty(world * 4 - 1), f),
             ("all_gather_into_tensor", who, "output must have"))
    c.raises("reduce_scatter_tensor wrong input size", ValueError,
             lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world + 1)),
             ("reduce_scatter_tensor", who))
    c.raises("all_gather mixed dtypes", TypeError,
             lambda: pg.allgather([[torch.empty(4, dtype=torch.float64) for _ in range(world)]], [f]),
             ("allgather", who, "dtype"))
    c.raises("all_gather wrong list length", ValueError,
             lambda: pg.allgather([[torch.empty(4) for _ in range(world + 1)]], [f]),
             ("allgather", who, "output list has"))
    c.raises("all_to_all_single splits do not sum", ValueError,
             lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world),
                                            [1] * world, [2] + [1] * (world - 1)),
             ("all_to_all_single", who, "split sizes sum"))
    own = [1] * world  # what a rank sends itself it must receive from itself
    c.raises("all_to_all_single own block sizes differ", ValueError,
             lambda: dist.all_to_all_single(torch.empty(world + 1), torch.ones(world),
                                            [2 if r == rank else 1 for r in range(world)], own),
             ("all_to_all_single", who, "sends itself 1 elements but receives 2"))
    c.raises("all_to_all own block sizes differ", ValueError,
             lambda: dist.all_to_all([torch.empty(2 if r == rank else 1) for r in range(world)],
                                     [torch.ones(1) for _ in range(world)]),
             ("all_to_all", who, "sends itself 1 elements but receives 2"))
    c.raises("all_to_all_single uneven without splits", ValueError,
             lambda: dist.all_to_all_single(torch.empty(world + 1), torch.ones(world + 1)),
             ("all_to_all_single", who, "divide evenly")) if world > 1 else None


def tensor_kinds_refused(job):
    # all_reduce takes sparse COO tensors (collectives.py tests it; torch's dispatcher refuses
    # them to the other ops before mpigpu sees them), but not mixed with dense ones
    job.c.raises("sparse tensor in a dense all_reduce list", TypeError,
                 lambda: job.pg.allreduce([torch.eye(3).to_sparse(), torch.ones(3)]).wait(),
                 ("allreduce", job.who, "mixes sparse COO"))


def p2p_peers_tags_refused(job):
    c, pg, rank, world, who, f = job.c, job.pg, job.rank, job.world, job.who, job.f
    c.raises("send to self", ValueError, lambda: pg.send([f], rank, 0), ("send", who, "yourself"))
    c.raises("send to out-of-range peer", ValueError, lambda: pg.send([f], world + 1, 0),
             ("send", who, "out of range"))
    c.raises("negative tag", ValueError, lambda: pg.recv([f], (rank + 1) % world, -3) if world > 1
             else pg.recv([f], 1, -3), ("recv", who))


def gather_list_on_non_root_refused(job):
    c, pg, rank, world, who, f = job.c, job.pg, job.rank, job.world, job.who, job.f
    c.raises("gather list on non-root", ValueError,
             lambda: pg.gather([[torch.empty(4) for _ in range(world)]], [f], _gather_opts((rank + 1) % world))
             if world > 1 else pg.gather([[torch.empty(4)]], [f], _gather_opts(5)),
             ("gather", who))


def backend_checks(job):
    c, who, f = job.c, job.who, job.f
    be = job.pg._get_backend(torch.device("cpu"))  # our backend itself: no torch-side checks in front
    c.raises("meta tensor", TypeError, lambda: be.allreduce([torch.empty(3, device="meta")]),
             ("allreduce", who, "meta"))
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8)
    c.raises("quantized tensor", TypeError, lambda: be.allreduce([q]), ("allreduce", who, "quantized"))
    if torch.cuda.is_available():  # (a meta tensor would be refused as meta first)
        c.raises("tensors on two devices in one call", TypeError,
                 lambda: be.allreduce([torch.ones(3), torch.ones(3, device="cuda")]),
                 ("allreduce", who, "one device"))
    c.raises("empty tensor list", ValueError, lambda: be.allreduce([]), ("allreduce", who))
    c.raises("non-zero rootTensor", ValueError,
             lambda: be.broadcast([f.clone()], _bcast_opts(0, 1)), ("broadcast", who, "rootTensor"))


def use_after_destroy_refused(job):
    # use after destroy: the backend object of a destroyed group refuses, it does not crash
    g = dist.new_group(list(range(job.world)))
    gb = g._get_backend(torch.device("cpu"))
    dist.destroy_process_group(g)
    job.c.raises("use after destroy_process_group", ValueError, lambda: gb.allreduce([job.f.clone()]),
                 ("allreduce", job.who, "destroyed"))


def coalescing_block_that_raised(job):
    """torch ends a coalescing block only when its body returns: an op that raises in it, or the
    caller's own error, leaves our side of the block open (every later batch_isend_irecv failed
    with "coalescing already started" before)."""
    c, pg, rank, world, who = job.c, job.pg, job.rank, job.world, job.who
    manager = dist.distributed_c10d._coalescing_manager
    cpu = torch.device("cpu")

    def body_raises():
        with manager(pg, cpu, async_ops=True):
            raise KeyError("the caller's own error")

    def coalesced_sum(value):
        t = torch.full((4,), value)
        with manager(pg, cpu, async_ops=True) as cm:
            dist.all_reduce(t)
        cm.wait()
        return t

    c.raises("a block whose body raised", KeyError, body_raises)
    c.close("a block after it", coalesced_sum(float(rank)),
            torch.full((4,), float(sum(range(world)))))
    if world > 1:
        after, before = (rank + 1) % world, (rank - 1) % world

        def ring_batch(tag):
            got = torch.zeros(4)
            ops = [dist.P2POp(dist.isend, torch.full((4,), rank + 1.0), after, tag=tag),
                   dist.P2POp(dist.irecv, got, before, tag=tag)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            return got

        c.raises("batch_isend_irecv with a negative tag", ValueError, lambda: ring_batch(-3),
                 ("send", who, "tag -3"))
        c.close("a batch after it", ring_batch(5), torch.full((4,), before + 1.0))
        c.close("a block after that", coalesced_sum(1.0), torch.full((4,), float(world)))


def works_after(job):
    rank, world = job.rank, job.world
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    job.c.close("works after errors", t, torch.full((3,), float(sum(range(world)))))


def _gather_opts(root):
    o = dist.GatherOptions()
    o.rootRank = root
    return o


def _bcast_opts(root, root_tensor):
    o = dist.BroadcastOptions()
    o.rootRank = root
    o.rootTensor = root_tensor
    return o


def _opts(op):
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


if __name__ == "__main__":
    run(main)
