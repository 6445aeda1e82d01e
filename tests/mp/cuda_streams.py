"""CUDA stream ordering (run only on a GPU): a collective issued while the producer kernel is
still running must see the producer's result; consumers on other streams that wait on the Work or
its future must see the op's result; an op queues an ordering event only where the stream has
work left. Every ordering check here fails if the ordering is missing:
the producer sleeps on the GPU for tens of milliseconds before writing, so an unordered read sees
the old zeros. Last, an op issued while the stream is captured into a CUDA graph is refused (a
graph cannot replay MPI), the capture left intact. MPIGPU_EXPECT_PATH names the path the run must
take (so a test of the staged path cannot silently run the direct one)."""

import contextlib
import ctypes
import os

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, run, use_test_device

SLEEP_CYCLES = 200_000_000  # torch.cuda._sleep: ~0.1 s on a 2 GHz GPU clock
N = 1 << 20


def busy_then_fill(t, value):
    """On the current stream: keep the GPU busy, then write `value` (the real producer)."""
    torch.cuda._sleep(SLEEP_CYCLES)
    t.fill_(value)


@contextlib.contextmanager
def on(stream):
    """Work on `stream`, after everything already queued on the current stream: the buffers were
    made there (torch.zeros), and a clone on `stream` that does not wait for their fill can read
    a recycled block's old values (#24: 42.0 seen where zeros were due)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield


class Job:
    """What the sections share: the checker, this rank, the group's size, the device, the sum of
    every rank's rank + 1, and the producer's and a consumer's streams."""

    def __init__(self, c, rank, world, dev):
        self.c, self.rank, self.world, self.dev = c, rank, world, dev
        self.total = float(world * (world + 1) // 2)
        self.producer, self.consumer = torch.cuda.Stream(), torch.cuda.Stream()


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = use_test_device()
    path = torch_mpi_gpu._C.cuda_path()[0]
    c = Checker(f"cuda_streams(np={world}, path={path})")
    job = Job(c, rank, world, dev)

    c.section("collectives issued while the producer runs")
    while_the_producer_runs(job)
    if world > 1:
        c.section("send/recv from a busy stream")
        send_recv_from_a_busy_stream(job)

    c.section("Work.wait() orders another stream")
    work_wait_orders_another_stream(job)

    c.section("the future orders another stream")
    future_orders_another_stream(job)

    c.section("8 async ops in flight from a busy stream")
    async_ops_in_flight(job)

    c.section("an ordering event only where the stream has work left")
    x = ordering_event_where_work_is_left(job)
    ordering_events_always(job, x)

    c.section("an op inside a CUDA graph capture is refused")
    refused_inside_a_graph_capture(job)

    return c.finish()


def while_the_producer_runs(job):
    """1. The producer is still running when the collective is issued on its stream; the same for
    a broadcast from a busy root and an all_gather."""
    c, rank, world, dev, producer = job.c, job.rank, job.world, job.dev, job.producer
    for async_op in (False, True):
        t = torch.zeros(N, device=dev)
        with on(producer):
            busy_then_fill(t, rank + 1.0)
            w = dist.all_reduce(t, async_op=async_op)
            if async_op:
                w.wait()
            seen = t.clone()  # on the producer stream, after the op
        torch.cuda.synchronize()
        c.close(f"all_reduce after a running producer (async={async_op})", seen,
                torch.full((N,), job.total))

    t = torch.zeros(N, device=dev)
    with on(producer):
        if rank == 0:
            busy_then_fill(t, 42.0)
        dist.broadcast(t, src=0)
        seen = t.clone()
    torch.cuda.synchronize()
    c.close("broadcast from a busy root", seen, torch.full((N,), 42.0))

    mine = torch.zeros(N // 4, device=dev)
    outs = [torch.empty_like(mine) for _ in range(world)]
    with on(producer):
        busy_then_fill(mine, float(rank))
        dist.all_gather(outs, mine)
        seen = torch.stack(outs)
    torch.cuda.synchronize()
    c.close("all_gather after a running producer", seen,
            torch.arange(world, dtype=torch.float32).repeat_interleave(N // 4).reshape(world, -1))


def send_recv_from_a_busy_stream(job):
    c, rank, dev = job.c, job.rank, job.dev
    buf = torch.zeros(N, device=dev)
    with on(job.producer):
        if rank == 0:
            busy_then_fill(buf, 7.0)
            dist.send(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
        seen = buf.clone()
    torch.cuda.synchronize()
    if rank in (0, 1):
        c.close("send from a busy stream / recv", seen, torch.full((N,), 7.0))
    else:  # not part of the exchange: its buffer must stay untouched
        c.close("a rank outside the send/recv keeps its buffer", seen, torch.zeros(N))


def work_wait_orders_another_stream(job):
    """2. Results consumed on another stream, ordered by Work.wait()."""
    consumer = job.consumer
    t = torch.full((N,), job.rank + 1.0, device=job.dev)
    torch.cuda.current_stream().synchronize()
    w = dist.all_reduce(t, async_op=True)
    with torch.cuda.stream(consumer):  # ordered by the Work or future alone
        w.wait()
        doubled = t * 2
    consumer.synchronize()
    job.c.close("async all_reduce consumed on another stream", doubled, torch.full((N,), 2 * job.total))


def future_orders_another_stream(job):
    """3. The future is CUDA-aware: then() callbacks and wait() on another stream see the result."""
    consumer = job.consumer
    t = torch.zeros(N, device=job.dev)
    with on(job.producer):
        busy_then_fill(t, job.rank + 1.0)
        fut = dist.all_reduce(t, async_op=True).get_future()
    chained = fut.then(lambda f: f.value()[0] * 3)
    with torch.cuda.stream(consumer):  # ordered by the Work or future alone
        tripled = chained.wait() + 0
    consumer.synchronize()
    job.c.close("future.then consumed on another stream", tripled, torch.full((N,), 3 * job.total))


def async_ops_in_flight(job):
    """4. Many async ops in flight from a busy stream, waited in reverse order."""
    rank, world = job.rank, job.world
    ts = [torch.zeros(N // 16, device=job.dev) for _ in range(8)]
    with on(job.producer):
        torch.cuda._sleep(SLEEP_CYCLES)
        for i, x in enumerate(ts):
            x.fill_(float(rank + i))
        works = [dist.all_reduce(x, async_op=True) for x in ts]
        for w in reversed(works):
            w.wait()
        seen = torch.stack(ts)
    torch.cuda.synchronize()
    exp = torch.stack([torch.full((N // 16,), float(sum(r + i for r in range(world))))
                       for i in range(8)])
    job.c.close("8 async all_reduces in flight", seen, exp)


def ordering_event_where_work_is_left(job):
    """5. An ordering event only where the stream has work left: each is a command on the device,
    and on a GPU the ranks share one queued while a peer's work runs costs a switch between their
    time slices (the node leader's next op, issued while its peers copy out). Returns the tensor
    it reduced."""
    c, rank = job.c, job.rank
    x = torch.full((N // 16,), rank + 1.0, device=job.dev)
    torch.cuda.synchronize()
    idle = torch_mpi_gpu._C.node_waits()
    dist.all_reduce(x)  # the current stream has finished everything: no event at the start
    busy = torch_mpi_gpu._C.node_waits()
    torch.cuda._sleep(SLEEP_CYCLES)
    x.fill_(rank + 1.0)  # the producer, still queued when the op is issued
    dist.all_reduce(x)
    after = torch_mpi_gpu._C.node_waits()
    torch.cuda.synchronize()
    c.true("an op issued on an idle stream leaves out its start event",
           busy["stream_events_skipped"] > idle["stream_events_skipped"],
           f"skipped {idle['stream_events_skipped']} -> {busy['stream_events_skipped']}")
    c.true("an op issued on a busy stream records its start event",
           after["stream_events"] > busy["stream_events"],
           f"recorded {busy['stream_events']} -> {after['stream_events']}")
    c.close("the op after a busy producer sees the producer's values", x,
            torch.full((N // 16,), job.total))
    return x


def ordering_events_always(job, x):
    """TORCH_MPIGPU_CUDA_ORDER_EVENTS=always (read at group creation): both events in every op."""
    c, rank, world, total = job.c, job.rank, job.world, job.total
    os.environ["TORCH_MPIGPU_CUDA_ORDER_EVENTS"] = "always"
    always = dist.new_group(list(range(world)))
    del os.environ["TORCH_MPIGPU_CUDA_ORDER_EVENTS"]
    x.fill_(rank + 1.0)
    torch.cuda.synchronize()
    before = torch_mpi_gpu._C.node_waits()
    dist.all_reduce(x, group=always)
    after = torch_mpi_gpu._C.node_waits()
    c.true("CUDA_ORDER_EVENTS=always records both events on an idle stream",
           after["stream_events"] - before["stream_events"] >= 2
           and after["stream_events_skipped"] == before["stream_events_skipped"],
           f"recorded {before['stream_events']} -> {after['stream_events']}, skipped "
           f"{before['stream_events_skipped']} -> {after['stream_events_skipped']}")
    c.close("CUDA_ORDER_EVENTS=always: the values", x, torch.full((N // 16,), total))
    # ... and it keeps the legacy default stream's implicit wait for a blocking stream made
    # outside torch (architecture.md): the producer on such a stream, the op issued on the idle
    # legacy stream. (auto leaves that event out: there the caller must synchronize itself.)
    if torch.cuda.current_stream().cuda_stream == 0:  # the legacy default stream is current
        libcuda = ctypes.CDLL("libcuda.so.1")
        handle = ctypes.c_void_p()
        c.true("a blocking stream made with the driver", libcuda.cuStreamCreate(ctypes.byref(handle), 0) == 0)
        y = torch.zeros(N // 16, device=job.dev)
        torch.cuda.synchronize()
        with torch.cuda.stream(torch.cuda.ExternalStream(handle.value)):
            busy_then_fill(y, rank + 1.0)
        dist.all_reduce(y, group=always)
        torch.cuda.synchronize()
        libcuda.cuStreamDestroy_v2(handle)
        c.close("CUDA_ORDER_EVENTS=always: after a blocking stream made outside torch", y,
                torch.full((N // 16,), total))


def refused_inside_a_graph_capture(job):
    """6. Inside a CUDA graph capture: refused before anything is queued (MPI runs from the host,
    so a graph could never replay the op); the capture stays intact and the group works after."""
    c, rank, world = job.c, job.rank, job.world
    x = torch.full((N // 16,), rank + 1.0, device=job.dev)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()

    def all_reduce_while_capturing():
        with torch.cuda.graph(graph):
            x.mul_(2)
            dist.all_reduce(x)

    def isend_while_capturing():
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            x.add_(0)
            dist.isend(x, (rank + 1) % world)

    for case, fn, name in (("all_reduce", all_reduce_while_capturing, "allreduce"),
                           ("isend", isend_while_capturing, "send")):
        c.raises(f"{case} while capturing", RuntimeError, fn,
                 must_contain=(f"mpigpu {name} [rank {rank}]", "captured into a CUDA graph",
                               "outside the captured region"))
    graph.replay()  # the captured compute alone: x doubled
    dist.all_reduce(x)
    torch.cuda.synchronize()
    c.close("the capture replays its compute and the group works after", x,
            torch.full((N // 16,), 2 * job.total))


if __name__ == "__main__":
    run(main)
