// The C++ side of the TORCH_MPIGPU_* settings (documented in torch_mpi_gpu/config.py and the
// README). Read once per process group at creation, so tests can change them between groups.
#pragma once

#include <cstdint>
#include <string>

namespace mpigpu {

struct Config {
  // Largest element count handed to one MPI call; bigger messages are split (MPI counts are int).
  int64_t maxElementsPerCall = 2147483647;
  // Log which path each op takes and op sequence numbers (TORCH_MPIGPU_DEBUG=1).
  bool debug = false;
  // Overrides the process group timeout when > 0 (TORCH_MPIGPU_TIMEOUT, seconds).
  double timeoutSeconds = 0;

  static Config fromEnv();
};

} // namespace mpigpu
