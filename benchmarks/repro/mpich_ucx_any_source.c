/* Reproduces MPICH 5.0.2's ucx netmod never completing MPI_Irecv(MPI_ANY_SOURCE) across hosts.
 *
 * Reproducer (no mpigpu, plain C) of MPICH's ucx netmod losing receives posted from any source,
 * for an MPICH report. Found by tests/test_hang_prone.py::test_p2p_groups_by_slot under MPICH's
 * Hydra across the two simulated hosts (about 1 run in 10 hung in recv(src=None)).
 *
 * PyPI mpich 5.0.2 ("MPICH Device: ch4:ucx ofi"), this VM (2 cores), 2026-11-27:
 *   mpicc mpich_ucx_any_source.c -o repro
 *   mpiexec -n 2 ./repro                              -> done (shared memory between the ranks)
 *   MPIR_CVAR_NOLOCAL=1 mpiexec -n 2 ./repro          -> STALLED at iteration 2 or 3
 *   MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi mpiexec -n 2 ./repro   -> done
 *   two hosts x 2 ranks (scripts/two_hosts.sh up names; MPIGPU_TWO_HOSTS_MAP_BY=slot
 *   scripts/two_hosts.sh mpirun -np 4 ./repro)       -> STALLED at iteration 1
 *   the same with UCX_TLS=self,tcp (2026-11-28; without it UCX carries the two "hosts'" bytes
 *   through shared memory, with it over the veth)     -> STALLED (MPI_Abort 3), 2 of 2
 * The same with mpi4py: MPI_Irecv(MPI_ANY_SOURCE) + MPI_Test never completes although every
 * sender's MPI_Send returned; MPI_Improbe(MPI_ANY_SOURCE) + MPI_Mrecv in its place completes
 * 3000 of 3000 iterations, and so does a receive naming the source. Through mpigpu on Open MPI
 * 5.0.11 across the same hosts, the same loop ran 3000 of 3000 posted and by probe.
 *
 * Rank 0 receives size-1 messages per iteration from MPI_ANY_SOURCE, one tag per iteration;
 * every other rank sends one.
 *
 * MPICH across the two hosts (2026-11-27, PyPI mpich 5.0.2, Hydra with `-hosts h0:2,h1:2`):
 * `../repro/mpich_ucx_any_source.c` is the plain-C reproducer of the hang the new MPICH
 * two-host leg found (MPICH's ucx netmod never completes `MPI_Irecv(MPI_ANY_SOURCE)` for messages
 * from another host). Through mpigpu, 3000 iterations of rank 0 receiving 3 messages from any
 * source at 2 hosts x 2 ranks: `TORCH_MPIGPU_ANY_SOURCE_RECV=post` hung (killed after 60 s),
 * `auto` (matched probe on that netmod) finished; `p2p_groups.py` hung in 1 of 26 runs with `post`
 * and passed 20 of 20 with `auto`. Open MPI 5.0.11 on the same hosts: the 3000 iterations took
 * 5.34 s posted and 5.31 s by probe (one run each).
 */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  float x = 0;
  for (int it = 0; it < 2000; ++it) {
    if (rank != 0) {
      float y = (float)rank;
      MPI_Send(&y, 1, MPI_FLOAT, 0, 1000 + it, MPI_COMM_WORLD);
      continue;
    }
    for (int k = 0; k < size - 1; ++k) {
      MPI_Request req;
      int done = 0;
      MPI_Irecv(&x, 1, MPI_FLOAT, MPI_ANY_SOURCE, 1000 + it, MPI_COMM_WORLD, &req);
      const time_t start = time(NULL);
      while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done && time(NULL) - start > 10) {
          printf("STALLED at iteration %d message %d\n", it, k);
          fflush(stdout);
          MPI_Abort(MPI_COMM_WORLD, 3);
        }
      }
    }
  }
  if (rank == 0) printf("done\n");
  MPI_Finalize();
  return 0;
}
