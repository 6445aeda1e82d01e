"""Exits the way users exit (no os._exit): run by test_reliability.py, which checks how the job
ends. Modes:
  raise-in-collective  rank 1 raises while the others wait in all_reduce: the job must end within
                       seconds (traceback printed, then MPI_Abort), not hang in MPI_Finalize
  raise-at-start       rank 1 raises right after init while the others enter a barrier
  pending-async        every rank issues async all_reduces and exits without waiting: the queue is
                       run in order at exit, then MPI finalises cleanly (exit 0)
  clean                a normal exit after work: finalises cleanly (exit 0)
A rank that leaves before the others' collective (each must end the job within seconds, by the
departure notice the leaving rank leaves in the store, not at the 30-minute timeout):
  exit-in-collective   rank 1 calls sys.exit(3) while the others wait in all_reduce
  return-in-collective rank 1 reaches the end of the script while the others wait
  destroy-in-collective
                       rank 1 is given one batch fewer than the others and reaches
                       destroy_process_group (then the end) while they wait in all_reduce
  host-destroys-in-collective
                       the same for rank 0, the store's host (its store must outlive its destroy)
  exit-before-send     rank 1 exits while rank 0 waits in recv from it (point-to-point)
  exit-in-subgroup     the last rank exits while the other members of the group of ranks 1..n-1
                       wait in its all_reduce (rank 0, outside it, reaches the end meanwhile)
  unwaited-receive     rank 0 posts a receive from rank 1 and never waits for it; rank 1 ends
                       first: not a hang, so the job ends cleanly (exit 0)
  staggered-end        a normal end without destroy_process_group, rank 0 (the store's host)
                       first and the others a second later: exit 0, and no rank's departure
                       notice meets a closed store
  staggered-destroy    the same with destroy_process_group (a subgroup, then the default group)
                       and rank 0 staying alive meanwhile: its store must outlive its own destroy
Signals from outside (test_reliability.py sends them):
  wait-for-a-signal    every rank prints its pid and waits: rank 1 in Python (time.sleep), rank 0
                       in a blocking all_reduce (inside MPI, on its own thread), the others in
                       wait() on an async one (run by the group's worker); then the launcher
                       gets Ctrl-C (SIGINT) or SIGTERM
  preempted            Slurm's way of ending a job (scancel, the time limit, preemption): SIGTERM
                       to every task; the program's handler only sets a flag, the ranks agree at
                       the next step that all were told (MIN), and each stops there, clean. All
                       along, each rank takes SIGALRM every 0.5 ms (a sampling profiler's timer),
                       so signals land inside MPI calls and mpigpu's waits; every op's result is
                       checked
"""

import atexit
import sys

import torch
import torch.distributed as dist

pending = []  # pending-async: the tensors of the ops left unwaited


@atexit.register  # before torch_mpi_gpu's own exit hook, so it runs after it (exit hooks: LIFO)
def queued_ops_ran():
    if pending:
        want = float(sum(range(world)))
        right = sum(bool((t == want).all()) for t in pending)
        print(f"rank {rank}: after exit, {right} of {len(pending)} queued ops ran "
              f"with the right result", flush=True)


import torch_mpi_gpu  # noqa: E402,F401

mode = sys.argv[1]


dist.init_process_group("mpigpu")
rank, world = dist.get_rank(), dist.get_world_size()

if mode == "raise-in-collective":
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.all_reduce(t)  # waits for rank 1 forever unless the job is ended
    print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode == "raise-at-start":
    if rank == 1:
        raise ValueError("rank 1 fails on purpose at start-up")
    dist.barrier()
    print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode == "pending-async":
    # large enough to be in flight on the worker when the script ends
    pending += [torch.full((1 << 18,), float(rank)) for _ in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in pending]
    print(f"rank {rank}: exiting with {len(works)} async ops unwaited", flush=True)
elif mode in ("exit-in-collective", "return-in-collective"):
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        print(f"rank 1: leaving ({mode})", flush=True)
        if mode == "exit-in-collective":
            sys.exit(3)
    else:
        dist.all_reduce(t)  # waits for rank 1 forever unless the job is ended
        print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode in ("destroy-in-collective", "host-destroys-in-collective"):
    leaver = 0 if mode.startswith("host") else 1
    batches = 2 if rank == leaver else 3  # uneven data: the classic DDP hang
    t = torch.ones(4)
    for _ in range(batches):
        dist.all_reduce(t)
    print(f"rank {rank}: ran out of batches after {batches}", flush=True)
    dist.destroy_process_group()
    if rank != leaver:
        print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode == "exit-before-send":
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        print("rank 1: leaving before its send", flush=True)
        sys.exit(3)
    if rank == 0:
        dist.recv(t, src=1)  # waits for rank 1 forever unless the job is ended
        print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode == "unwaited-receive":
    import time
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        unwaited = dist.irecv(torch.zeros(4), src=1)  # never matched, never waited for
    dist.all_reduce(t)
    if rank == 0:
        time.sleep(3)  # rank 1 has left meanwhile, past the departure check's second
    print(f"rank {rank}: clean end with a receive never waited for", flush=True)
elif mode == "exit-in-subgroup":
    group = dist.new_group(list(range(1, world)))
    if rank > 0:
        t = torch.ones(4)
        dist.all_reduce(t, group=group)
        if rank == world - 1:
            print(f"rank {rank}: leaving its group", flush=True)
            sys.exit(3)
        dist.all_reduce(t, group=group)
        print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode in ("staggered-end", "staggered-destroy"):
    import time
    t = torch.ones(4)
    group = dist.new_group(list(range(world)))
    dist.all_reduce(t)
    dist.all_reduce(t, group=group)
    if rank > 0:
        time.sleep(1.5)
    if mode == "staggered-destroy":
        dist.destroy_process_group(group)
        del group  # (a group object still referenced holds the store, for every backend)
        dist.destroy_process_group()
        if rank == 0:
            import os
            import socket
            time.sleep(3)  # alive, its groups destroyed, while the others destroy theirs
            try:  # ... and let go of once they have: its server no longer listens
                socket.create_connection((os.environ["MASTER_ADDR"],
                                          int(os.environ["MASTER_PORT"])), timeout=5).close()
                print("rank 0: the store still listens after every rank destroyed", flush=True)
            except ConnectionRefusedError:
                pass
    print(f"rank {rank}: {mode.replace('-', ' ')}", flush=True)
elif mode == "wait-for-a-signal":
    import os
    import time
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    print(f"rank {rank} pid {os.getpid()} waiting", flush=True)
    if rank == 1:
        time.sleep(600)
    elif rank == 0:
        dist.all_reduce(t)
    else:
        dist.all_reduce(t, async_op=True).wait()
    print(f"rank {rank}: UNREACHABLE", flush=True)
elif mode == "preempted":
    import os
    import signal
    told = torch.zeros(1)
    alarms = [0]
    signal.signal(signal.SIGTERM, lambda *_: told.fill_(1))
    signal.signal(signal.SIGALRM, lambda *_: alarms.__setitem__(0, alarms[0] + 1))
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
    print(f"rank {rank} pid {os.getpid()} waiting", flush=True)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    step = wrong = 0
    announced = False
    while True:
        if not announced and alarms[0] >= 200:  # the test signals once every rank said so
            print(f"rank {rank}: 200 SIGALRMs taken", flush=True)
            announced = True
        small = torch.full((1024,), float(rank + step))
        dist.all_reduce(small)  # blocking: runs on this thread, inside MPI
        wrong += int((small != sum(range(world)) + world * step).sum())
        big = torch.full((1 << 18,), float(rank))
        big_work = dist.all_reduce(big, async_op=True)  # on the group's worker
        got = torch.zeros(64)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((64,), float(rank)), nxt),
                                         dist.P2POp(dist.irecv, got, prv)]):
            w.wait()
        wrong += int((got != prv).sum())
        big_work.wait()
        wrong += int((big != sum(range(world))).sum())
        everyone_told = told.clone()
        dist.all_reduce(everyone_told, op=dist.ReduceOp.MIN)
        if everyone_told.item():
            break
        step += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    steps = [None] * world
    dist.all_gather_object(steps, step)
    print(f"rank {rank}: stopped at step {step} (every rank's: {steps}) after {alarms[0]} "
          f"SIGALRMs, {wrong} wrong elements", flush=True)
    dist.destroy_process_group()
elif mode == "clean":
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == world
    dist.destroy_process_group()
    print(f"rank {rank}: clean exit", flush=True)
