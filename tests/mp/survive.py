"""A rank SIGKILLed at a chosen point, under a fault-tolerant MPI (ULFM, `mpirun --with-ft ulfm`
with the flags of torch_mpi_gpu.mpirun --fault-tolerant): every survivor must get a
DistBackendError naming the failed rank within BOUND_S, see a group without the failed rank
still work, shrink the default group, and compute right on the shrunk group (a new DDP over it
too, at the ddp point) and on a group made after it. Each survivor prints one line:

    SURVIVE OK rank R point P error_after S op OP
    SURVIVE FAIL rank R point P: why

Usage: survive.py POINT VICTIM KILL_FILE [DELAY_S]; POINT is one of POINTS. The victim writes the
time it dies to KILL_FILE (the survivors measure the time to their error from it) and SIGKILLs
itself DELAY_S (default 0.6) after the ops begin. Rank 0 hosts the rendezvous store and is never
the victim."""

import os
import re
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import torch_mpi_gpu  # noqa: F401

POINTS = ("allreduce", "p2p", "new_group", "ddp", "idle")
BOUND_S = 10.0
DDP = []
LOOP_S = 30.0  # a loop that has not failed by then is a failure (the kill did not reach it)


def die(kill_file):
    with open(kill_file + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(kill_file + ".tmp", kill_file)
    os.kill(os.getpid(), signal.SIGKILL)


def loop(point, rank, world):
    """Runs ops of `point` until one raises; returns (the exception, its time)."""
    start = time.time()
    step = 0
    if point == "allreduce":
        t = torch.ones(4 << 20)  # 16 MiB: the kill falls inside an op
        while time.time() - start < LOOP_S:
            try:
                dist.all_reduce(t)
            except Exception as e:  # noqa: BLE001
                return e, time.time(), "all_reduce"
            t.fill_(1.0)
    elif point == "p2p":
        send, recv = torch.full((1 << 18,), float(rank)), torch.empty(1 << 18)
        while time.time() - start < LOOP_S:
            try:
                ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
                       dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
            except Exception as e:  # noqa: BLE001
                return e, time.time(), "send/recv"
    elif point == "new_group":
        while time.time() - start < LOOP_S:
            try:
                g = dist.new_group(list(range(world)))
                t = torch.ones(8)
                dist.all_reduce(t, group=g)
                dist.destroy_process_group(g)
            except Exception as e:  # noqa: BLE001
                return e, time.time(), "new_group"
            step += 1
    elif point == "ddp":
        ddp = DDP[0]
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        while time.time() - start < LOOP_S:
            try:
                x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
                loss = torch.nn.functional.cross_entropy(ddp(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            except Exception as e:  # noqa: BLE001
                return e, time.time(), "DDP step"
    elif point == "idle":
        time.sleep(1.0)  # the victim dies meanwhile
        try:
            t = torch.ones(8)
            dist.all_reduce(t)
        except Exception as e:  # noqa: BLE001
            return e, time.time(), "all_reduce after idle"
    return None, time.time(), point


def main():
    point, victim, kill_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    delay = float(sys.argv[4]) if len(sys.argv) > 4 else 0.6
    assert point in POINTS, point
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert 0 < victim < world, "the victim must not be rank 0 (the store's host)"
    survivors = [r for r in range(world) if r != victim]
    # made by every rank before the kill: a group without the victim must keep working
    others = dist.new_group(survivors)
    if point == "ddp":  # made before the kill: its constructor's collectives are not DDP steps
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10))
        DDP.append(torch.nn.parallel.DistributedDataParallel(model))
    dist.barrier()
    if rank == victim:
        if point == "idle":
            die(kill_file)
        threading.Timer(delay, die, (kill_file,)).start()
    error, at, op = loop(point, rank, world)

    def fail(why):
        print(f"SURVIVE FAIL rank {rank} point {point}: {why}", flush=True)
        os._exit(1)

    if error is None:
        fail(f"no op failed within {LOOP_S} s")
    for _ in range(100):  # the victim writes the file just before it dies
        if os.path.exists(kill_file):
            break
        time.sleep(0.05)
    killed = float(open(kill_file).read())
    after = at - killed
    text = str(error)
    if not isinstance(error, dist.DistBackendError):
        fail(f"{type(error).__name__}, not DistBackendError: {text[:400]}")
    if not re.search(rf"rank[s]? [^.;\]]*\b{victim}\b", text):
        fail(f"the error does not name rank {victim}: {text[:600]}")
    if after > BOUND_S:
        fail(f"the error came {after:.1f} s after the kill (bound {BOUND_S} s)")
    print(f"[rank {rank}] the error: {text.splitlines()[0][:400]}", flush=True)
    # a group without the failed rank works as before
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, group=others)
    want = float(sum(r + 1 for r in survivors))
    if not torch.equal(t, torch.full((3,), want)):
        fail(f"all_reduce on the group without rank {victim}: {t.tolist()} != {want}")
    # shrink the default group; torch renumbers its ranks
    dist.shrink_group([victim])
    if dist.get_world_size() != world - 1 or dist.get_rank() != survivors.index(rank):
        fail(f"after shrink_group: rank {dist.get_rank()} of {dist.get_world_size()}")
    t = torch.full((5,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((5,), want, dtype=torch.float64)):
        fail(f"all_reduce on the shrunk default group: {t.tolist()} != {want}")
    if point == "ddp":  # a new DDP over the shrunk default group steps, and stays equal
        ddp = torch.nn.parallel.DistributedDataParallel(DDP[0].module)
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
        ddp(x).sum().backward()
        torch.optim.SGD(ddp.parameters(), lr=0.01).step()
        flat = torch.cat([q.detach().reshape(-1) for q in ddp.parameters()])
        every = torch.empty((world - 1) * flat.numel())
        dist.all_gather_into_tensor(every, flat)
        if not all(torch.equal(row, flat) for row in every.view(world - 1, -1)):
            fail("parameters differ after a DDP step on the shrunk default group")
    g = dist.new_group(list(range(world - 1)))
    out = torch.empty(world - 1)
    dist.all_gather_into_tensor(out, torch.tensor([float(rank)]), group=g)
    if out.tolist() != [float(r) for r in survivors]:
        fail(f"all_gather on a group made after the shrink: {out.tolist()}")
    print(f"SURVIVE OK rank {rank} point {point} error_after {after:.2f} op {op}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
