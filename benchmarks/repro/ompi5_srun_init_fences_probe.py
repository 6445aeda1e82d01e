"""Reproduces ranks leaving MPI_Init's PMIx fences out of step under srun (open-mpi/ompi#12495).

Probe (plain mpi4py, no mpigpu) of whether MPI_Init's PMIx fences hold every rank until all
have reached them, and whether a PMIx fence right after MPI_Init does: the background of Open MPI
5's start-up crash under srun --mpi=pmix (docs/launchers.md, open-mpi/ompi#12495).

Each rank notes, in $FENCE_LOG, when MPI_Init returned and when a PMIx_Fence (all ranks of the
job) called after it returned; the shim (ompi5_srun_init_fences_shim.c, LD_PRELOAD) holds back
every fence release of rank 0 by 0.5 s and notes them too:

  cc -shared -fPIC -O2 -o /tmp/slow_fence.so benchmarks/repro/ompi5_srun_init_fences_shim.c -ldl
  scripts/slurm_cluster.sh up-two-hosts
  FENCE_LOG=/tmp/fences.log LD_PRELOAD=/tmp/slow_fence.so MPIGPU_TEST_SLOW_FENCE_RANK=0 \
    PMIX_MCA_psec=native scripts/slurm_cluster.sh srun --mpi=pmix -N 2 -n 3 --overcommit \
    python benchmarks/repro/ompi5_srun_init_fences_probe.py
  sort /tmp/fences.log
  (Open MPI's own launcher: scripts/two_hosts.sh up names; scripts/two_hosts.sh mpirun -np 3
   -x PATH -x FENCE_LOG=... -x LD_PRELOAD=... -x MPIGPU_TEST_SLOW_FENCE_RANK=0 python ...)

Measured 2026-12-04 on the 2-core VM, PyPI's Open MPI 5.0.11, Debian's Slurm 22.05 (pmix_v4):
- srun, 2 + 1 ranks: rank 2 (h1) left MPI_Init at +0.00 s, rank 1 (h0) at +0.51 s, rank 0 at
  +1.01 s; rank 2's PMIx_Fence after MPI_Init returned at +0.005 s, before rank 0 had called
  its own (+1.01 s). 2 + 2 ranks: ranks 2-3 left at +0.00 s, rank 1 at +0.48 s, rank 0 at
  +0.99 s; ranks 2-3's fence returned at once as well. The fences match across the nodes out of
  step, so a rank can leave MPI_Init while another is inside it, and no later fence orders them.
- mpirun across the same hosts, 3 ranks: ranks 1-2 left MPI_Init 0.5 s before rank 0 (its last
  fence release, held back: it was past setting up MPI_COMM_WORLD), and their PMIx_Fence
  returned only after rank 0 had called its own.
"""

import ctypes
import os
import time


def note(what):
    with open(os.environ.get("FENCE_LOG", "/tmp/fences.log"), "a") as log:
        log.write(f"{time.time():.6f} rank {os.environ.get('PMIX_RANK')} {what}\n")


from mpi4py import MPI  # noqa: E402  (MPI_Init)

note("MPI_Init returned")
pmix = ctypes.CDLL("libpmix.so.2", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
rc = pmix.PMIx_Fence(None, ctypes.c_size_t(0), None, ctypes.c_size_t(0))
note(f"PMIx_Fence after MPI_Init returned {rc}")
MPI.COMM_WORLD.Barrier()
note("barrier done")
