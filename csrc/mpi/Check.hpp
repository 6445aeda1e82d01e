// One macro wraps every MPI call: a failing call becomes a DistBackendError that names the op,
// the rank, the MPI call, MPI's own error string and where it happened (our communicators use
// MPI_ERRORS_RETURN, so MPI returns codes instead of aborting the job).
#pragma once

#include <mpi.h>

namespace mpigpu::mpi {

[[noreturn]] void throwMpiError(int code, const char* call, const char* op, int rank,
                                const char* file, int line);

}  // namespace mpigpu::mpi

#define MPIGPU_MPI_CHECK(call, op, rank)                                             \
  do {                                                                               \
    int mpigpu_rc_ = (call);                                                         \
    if (mpigpu_rc_ != MPI_SUCCESS) {                                                 \
      ::mpigpu::mpi::throwMpiError(mpigpu_rc_, #call, op, rank, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)
