"""Reproduces Open MPI 5.0.11 over TCP running a receive-first exchange at half the link's speed.

Reproducer (plain mpi4py, no mpigpu) of the 16 MiB all_reduce gap across two hosts: on Open MPI
5.0.11 over TCP, an exchange whose receive is posted before its send runs at half the link's speed.

Two simulated hosts x 1 rank (scripts/two_hosts.sh up names 10gbit: tbf at 10 Gbit/s each way):

  (cd /tmp && scripts/two_hosts.sh mpirun --bind-to none -np 2 python \\
      benchmarks/repro/ompi5_recv_first_exchange.py)

Each op is two exchanges of 8 MiB each way (as a 2-rank all_reduce: reduce-scatter, all-gather),
back to back, 40 ops. Measured 2026-11-28 (medians; every iteration alike, two runs):

  recv-first piece  8192 KiB: 26.8 / 27.0 ms      send-first piece  8192 KiB: 14.1 / 14.1 ms
  recv-first piece  1024 KiB: 26.6 / 26.7 ms      send-first piece  1024 KiB: 14.2 / 14.2 ms
  unshaped link: recv-first 10.4-11.5 ms, send-first 8.3-9.0 ms

2 x 8 MiB over 10 Gbit/s is 13.4 ms: send-first runs at the link's speed, recv-first at half.
Open MPI's own sendrecv (inside MPI_Allreduce) posts the receive first.
"""
import time

import numpy as np
from mpi4py import MPI

w = MPI.COMM_WORLD
peer = 1 - w.rank
n = 8 << 20
a = np.ones(n // 4, dtype=np.float32)
b = np.empty_like(a)


def run(mode, piece):
    ts = []
    for _ in range(40):
        t0 = time.perf_counter()
        for rep in range(2):
            offs = range(0, n // 4, piece // 4)
            sends = lambda: [w.Isend(a[o:o + piece // 4], dest=peer, tag=rep) for o in offs]
            recvs = lambda: [w.Irecv(b[o:o + piece // 4], source=peer, tag=rep) for o in offs]
            reqs = recvs() + sends() if mode == "recv-first" else sends() + recvs()
            MPI.Request.Waitall(reqs)
        ts.append(time.perf_counter() - t0)
    if w.rank == 0:
        s = sorted(ts)
        print("%-10s piece %5d KiB median %.1f ms | %s" % (
            mode, piece >> 10, s[len(s) // 2] * 1e3, " ".join("%.0f" % (x * 1e3) for x in ts)),
            flush=True)


for mode in ("recv-first", "send-first"):
    for piece in (8 << 20, 1 << 20):
        run(mode, piece)
