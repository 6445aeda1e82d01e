// The desync check (TORCH_MPIGPU_DESYNC_CHECK=1): before every collective the group's ranks
// compare what they are about to run with one small allgather, so ranks that disagree get the
// same DistBackendError listing each rank's call instead of a hang or corrupted memory.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mpi/Collectives.hpp"

namespace mpigpu {

// What ranks must agree on for a collective; -1: not part of the check (e.g. alltoall sizes).
struct Fingerprint {
  int64_t type = -1, dtype = -1, numel = -1, root = -1;
};

Fingerprint fingerprintOf(c10d::OpType type, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, int root);
// Collective over `comm`; throws on every rank when any rank's fingerprint differs.
void checkSameCollective(const mpi::Comm& comm, const std::string& group, const char* op,
                         uint64_t seq, const Fingerprint& mine);

}  // namespace mpigpu
