"""Point-to-point under the fast path's awkward timings: sends and receives posted on the caller
(or queued behind other ops), completed by a waiting caller's own tests or by the worker's
polling, after the worker has gone to deep sleep, with big (rendezvous) messages left in
flight while the caller computes, and from several threads at once on one group and on several.
Every payload is derived from (round, sender), so the receiver knows what must arrive.
Needs at least 2 ranks (one rank has nobody to talk to: it only checks the group comes up)."""

import random
import threading
import time

import torch
import torch.distributed as dist

from common import Checker, run


def payload(round_, sender, numel, thread=0):
    return torch.arange(numel, dtype=torch.float32) + (round_ * 1000 + sender * 10 + thread)


def ring_rounds(c, group, rank, world, rounds, numel, tag, thread, seed, ways=4):
    """Send to the next rank, receive from the previous one, in varied ways. (Threads sharing a
    group leave out batch_isend_irecv: torch's coalescing state is per group, not per thread.)"""
    rng = random.Random(seed)
    g = lambda r: dist.get_global_rank(group, r) if group is not None else r  # noqa: E731
    me = dist.get_rank(group) if group is not None else rank
    n = dist.get_world_size(group) if group is not None else world
    nxt, prv = g((me + 1) % n), g((me - 1) % n)
    for i in range(rounds):
        out = payload(i, me, numel, thread)
        got = torch.empty(numel)
        way = rng.randrange(ways)
        if way == 0:  # both posted, then waited at once (the caller tests for completion)
            ws = [dist.isend(out, nxt, group=group, tag=tag), dist.irecv(got, prv, group=group, tag=tag)]
            for w in ws:
                w.wait()
        elif way == 1:  # the receive first, waited late: the worker's polling completes it
            r = dist.irecv(got, prv, group=group, tag=tag)
            s = dist.isend(out, nxt, group=group, tag=tag)
            time.sleep(rng.choice([0, 0.001, 0.015]))  # 15 ms: past the worker's deep-sleep point
            s.wait()
            r.wait()
        elif way == 2:  # through the future
            ws = [dist.isend(out, nxt, group=group, tag=tag), dist.irecv(got, prv, group=group, tag=tag)]
            torch.futures.wait_all([w.get_future() for w in ws])
        else:  # batch_isend_irecv (torch's coalescing manager)
            ops = [dist.P2POp(dist.isend, out, nxt, group, tag), dist.P2POp(dist.irecv, got, prv, group, tag)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        c.close(f"thread {thread} round {i} way {way}", got, payload(i, (me - 1) % n, numel, thread))


def big_in_flight(c, rank, world):
    """A 16 MiB send left in flight while the caller computes, waited much later."""
    numel = 4 << 20
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out, got = payload(7, rank, numel), torch.empty(numel)
    r = dist.irecv(got, prv, tag=91)
    s = dist.isend(out, nxt, tag=91)
    x = torch.randn(256, 256)
    for _ in range(20):  # compute while the message moves (or waits for progress)
        x = torch.tanh(x @ x.T / 256)
    time.sleep(0.02)
    s.wait()
    r.wait()
    c.close("16 MiB send left in flight", got, payload(7, prv, numel))


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"p2p_stress(np={world})")
    if world == 1:
        c.section("single rank")
        c.true("single rank group", dist.get_world_size() == 1)
        return c.finish()
    c.section("ring rounds, one thread")
    ring_rounds(c, None, rank, world, 60, 1000, 0, 0, seed=rank)
    c.section("16 MiB message left in flight")
    big_in_flight(c, rank, world)

    # Several threads at once: two on the default group (distinct tags: one engine, concurrent
    # inline posts and waiting callers), and one per extra group (separate engines).
    groups = [dist.new_group(list(range(world))) for _ in range(2)]
    results = []

    def worker(thread, group, tag):
        tc = Checker(f"thread {thread}")
        tc.section(f"ring rounds, thread {thread} of 4 ({'default group' if group is None else 'own group'})")
        try:
            ring_rounds(tc, group, rank, world, 80, 257, tag, thread, seed=rank * 100 + thread,
                        ways=4 if group is not None else 3)
        except Exception as e:  # noqa: BLE001
            tc.true(f"thread {thread} ran", False, f"raised {type(e).__name__}: {e}")
        results.append(tc)

    threads = [threading.Thread(target=worker, args=(0, None, 10)),
               threading.Thread(target=worker, args=(1, None, 11)),
               threading.Thread(target=worker, args=(2, groups[0], 12)),
               threading.Thread(target=worker, args=(3, groups[1], 13))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    c.section("threads finish")
    c.true("every thread finished", not any(t.is_alive() for t in threads) and len(results) == 4)
    for tc in results:
        c.absorb(tc)
    dist.barrier()
    for g in groups:
        dist.destroy_process_group(g)
    return c.finish()


if __name__ == "__main__":
    run(main)
