/* An MPI_Abort that never returns and ends nothing, preloaded (LD_PRELOAD) by
 * tests/test_hang_prone.py: it stands in for an MPI whose abort leaves the job running (the
 * standard promises only a best attempt; Open MPI 5 across two hosts did so once in CI). The
 * process must still end: mpigpu's backstop (mpi::abortJob) exits it, and the launcher then
 * ends the job. The argument types do not matter to the call (two scalars in registers). */
#include <stdio.h>
#include <unistd.h>

int MPI_Abort(void *comm, int code) {
  (void)comm;
  fprintf(stderr, "stand-in MPI_Abort(code %d): returns never, ends nothing\n", code);
  fflush(stderr);
  for (;;) pause();
  return 0;
}
