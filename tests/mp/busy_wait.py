"""A rank that waits must not spin on two threads (#25): rank 1 arrives DELAY_S late to each op,
and rank 0 reads every thread's CPU time (/proc/self/task) around its wait. Its threads together
may use at most 1.2x what its busiest thread used: one thread polls (the one inside MPI), the
others sleep. Cases: a blocking collective run inline on the caller, one run on the group's
worker (a tensor above TORCH_MPIGPU_INLINE_BYTES, when the launch sets it), an async collective
waited for, a blocking recv and an irecv waited for, a barrier, and collectives through MPI's
own (TORCH_MPIGPU_ALGO=mpi) and through the ring (MPI point-to-point).

Launched crowded (TORCH_MPIGPU_MPI_YIELD=1, as on a host with more ranks than cores), the
waiting rank must also sleep: at most CROWDED_SHARE of the wait in CPU time. A rank spinning in
a blocking MPI call there takes a core the ranks it waits for need (MPICH, 4 ranks on 2 cores,
two computing: 5.1 s against 2.6 s, docs/performance.md)."""

import os
import time

import torch
import torch.distributed as dist
import torch_mpi_gpu

from common import Checker, run

DELAY_S = float(os.environ.get("MPIGPU_TEST_DELAY_S", "5"))
TICK = os.sysconf("SC_CLK_TCK")
CROWDED_SHARE = 0.25  # measured: 0.05-0.1 of the wait (a wake-up every 0.5 ms at most)
# The cases, a section each (tests/test_hang_prone.py reads them from here); the one on the
# worker runs only where the launch sets TORCH_MPIGPU_INLINE_BYTES
(INLINE_SYNC, WORKER_SYNC, ASYNC_WAIT, RECV, IRECV, BARRIER, BY_MPI, BY_RING) = SECTIONS = (
    "collective inline, sync", "collective on the worker, sync", "collective async, wait()",
    "recv, blocking", "irecv, wait()", "barrier", "collective by MPI's own",
    "collective by the ring")


def thread_cpu():
    """{thread id: (name, CPU seconds)} of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def cpu_during(fn):
    before = thread_cpu()
    start = time.monotonic()
    fn()
    took = time.monotonic() - start
    after = thread_cpu()
    used = {tid: (name, cpu - before.get(tid, (name, 0.0))[1]) for tid, (name, cpu) in after.items()}
    return took, used


def main():
    dist.init_process_group("mpigpu")
    rank = dist.get_rank()
    c = Checker("busy_wait")
    crowded = torch_mpi_gpu._C.oversubscribed()
    world = list(range(dist.get_world_size()))
    groups = {}
    for algo in ("mpi", "ring"):
        os.environ["TORCH_MPIGPU_ALGO"] = algo  # read when a group is made: this one only
        groups[algo] = dist.new_group(world)
    del os.environ["TORCH_MPIGPU_ALGO"]
    inline_limit = int(os.environ.get("TORCH_MPIGPU_INLINE_BYTES", str(1 << 40)))
    big = max(1, inline_limit // 4 + 1)  # fp32 elements above the inline limit: on the worker

    def inline_sync():
        dist.all_reduce(torch.ones(8))

    def worker_sync():
        dist.all_reduce(torch.ones(big))

    def async_wait():
        dist.all_reduce(torch.ones(8), async_op=True).wait()

    def blocking_recv():
        if rank == 0:
            dist.recv(torch.empty(8), src=1)
        else:
            dist.send(torch.ones(8), dst=0)

    def irecv_wait():
        if rank == 0:
            dist.irecv(torch.empty(8), src=1).wait()
        else:
            dist.isend(torch.ones(8), dst=0).wait()

    cases = {INLINE_SYNC: inline_sync, WORKER_SYNC: worker_sync, ASYNC_WAIT: async_wait,
             RECV: blocking_recv, IRECV: irecv_wait, BARRIER: dist.barrier,
             BY_MPI: lambda: dist.all_reduce(torch.ones(8), group=groups["mpi"]),
             BY_RING: lambda: dist.all_reduce(torch.ones(64), group=groups["ring"])}
    # small enough to run on the caller (below TORCH_MPIGPU_INLINE_BYTES, or no tensor at all)
    INLINE = {INLINE_SYNC, BARRIER, BY_MPI, BY_RING}
    POLLED_CPU_S = 0.1  # a thread that polled through the 1 s wait used far more
    # waits on MPI requests (mpi/Wait.hpp), not on the node's shared memory or the engine
    WAITS_FOR_MPI = {BARRIER, BY_MPI, BY_RING}
    for name, fn in cases.items():
        if name == WORKER_SYNC and inline_limit > (1 << 30):
            continue  # the launch without TORCH_MPIGPU_INLINE_BYTES runs everything inline
        c.section(name)
        dist.barrier()
        if rank != 0:
            time.sleep(DELAY_S)  # the late peer
            fn()
            c.skip("late peer", "it only arrives late; rank 0 measures the wait")
            continue
        slept_before = torch_mpi_gpu._C.sleeping_mpi_waits()
        took, used = cpu_during(fn)
        slept = torch_mpi_gpu._C.sleeping_mpi_waits() - slept_before
        total = sum(cpu for _, cpu in used.values())
        busiest = max(cpu for _, cpu in used.values())
        top = sorted(used.values(), key=lambda x: -x[1])[:3]
        print(f"[rank 0] {name}: waited {took:.1f} s, threads' CPU {total:.2f} s in all, busiest "
              f"{busiest:.2f} s ({', '.join(f'{n} {s:.2f}' for n, s in top)})", flush=True)
        c.true("the wait lasted as long as the peer was late", took >= DELAY_S * 0.8,
               f"waited {took:.2f} s")
        c.true("one thread polls, the others sleep", total <= 1.2 * busiest + 0.05,
               f"threads used {total:.2f} s CPU in all, the busiest {busiest:.2f} s: {top}")
        if crowded:
            c.true("crowded: the wait sleeps", total <= CROWDED_SHARE * took,
                   f"threads used {total:.2f} s CPU in a {took:.2f} s wait: {top}")
            if name in WAITS_FOR_MPI:
                c.true("crowded: the wait for MPI slept in mpi::wait", slept > 0,
                       f"{slept} sleeping MPI waits during it")
        # and the one that waited is the one expected: the caller for a collective run inline,
        # the group's worker otherwise (TORCH_MPIGPU_INLINE_BYTES decides; p2p is polled there)
        # (where every thread slept, as crowded waits and p2p's slow polls do, hundredths of a
        # second apart name no thread: nothing polled, which the checks above already hold)
        tid, (thread, _) = max(used.items(), key=lambda kv: kv[1][1])
        inline = name in INLINE
        if busiest < POLLED_CPU_S:
            c.skip("the waiting thread", f"every thread slept (busiest {busiest:.2f} s CPU)")
            continue
        c.true("the waiting thread", tid == str(os.getpid()) if inline else thread == "mpigpu-engine",
               f"busiest {thread} (thread {tid}), expected {'the caller' if inline else 'the worker'}")
    return c.finish()


if __name__ == "__main__":
    run(main)
