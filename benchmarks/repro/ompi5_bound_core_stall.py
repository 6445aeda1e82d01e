"""Reproduces #25's stall: Open MPI 5's TCP progress stops with two ranks bound to one core.

Reproducer (no mpigpu, plain mpi4py) of the stall behind #25, for an Open MPI report.

Open MPI 5.0.11 (PyPI), two simulated hosts (scripts/two_hosts.sh up names), a plain hostfile
(h0 slots=2, h1 slots=2), no --oversubscribe, so mpirun binds each rank to a core and, both
"hosts" sharing this machine's 2 cores, ranks 0 and 2 share core 0, ranks 1 and 3 core 1:

  ip netns exec mpigpu-h0 unshare --uts sh -c 'hostname h0; exec "$@"' h0 mpirun \\
      --hostfile /tmp/mpigpu-two-hosts/hostfile --mca plm_rsh_agent scripts/netns_rsh.sh \\
      -np 4 python ompi5_bound_core_stall.py MODE [SLEEP_S] [nocreate]

MODE main:   the MPI calls on the main thread                        -> passes (2 of 2)
MODE join:   on a second thread, the main thread blocked in join()    -> passes
MODE thread: on a second thread, the main thread waking every SLEEP_S -> SLEEP_S 0.001: hangs
             (2 of 2, and 2 of 2 with only an allreduce and a barrier on COMM_WORLD, "nocreate");
             no NET_RX softirq counted in 3 s while it hung: no packet moves. SLEEP_S 0.01 or 0.1,
             OMPI_MCA_mpi_yield_when_idle=1, or --bind-to none: passes.
"""
import sys
import threading
import time

from mpi4py import MPI

w = MPI.COMM_WORLD
rank, size = w.Get_rank(), w.Get_size()
mode = sys.argv[1]
nap = next((float(a) for a in sys.argv[2:] if a[0].isdigit()), 0.001)


def create(ranks, tag):
    return w.Create_group(w.Get_group().Incl(ranks), tag)


def on_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    if mode == "thread":
        while t.is_alive():
            time.sleep(nap)  # what mpigpu's Engine::runAndWait did (1 ms)
    t.join()
    return out[0]


run = (lambda fn: fn()) if mode == "main" else on_thread
t0 = time.time()
world = w if "nocreate" in sys.argv else run(lambda: create(list(range(size)), 101))
run(lambda: world.allreduce(rank))
if rank in (1, 3) and "nocreate" not in sys.argv:
    sub = run(lambda: create([1, 3], 202))
    run(lambda: sub.allreduce(rank))
run(lambda: world.Barrier())
print(f"rank {rank} ok {time.time() - t0:.2f}s", flush=True)
