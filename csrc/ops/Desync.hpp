// The desync check: ranks that disagree on a collective (the op, dtype, element count, root or
// reduce op) get the same DistBackendError on every rank, listing what each rank called, instead
// of a hang or silently wrong data.
//
// Comparing every op costs one small allgather per op. By default (TORCH_MPIGPU_DESYNC_CHECK=auto)
// a group compares every collective of its first DESYNC_CHECK_FIRST_OPS, where a program's
// mistakes show first (a wrong shape, a rank that skips an op), and after that one collective in
// every DESYNC_CHECK_INTERVAL: each rank folds every collective's fingerprint into a running
// digest, and the checked collective compares the digests too. A digest that differs makes the
// ranks exchange the fingerprints since the last check and name the first collective that
// differed. A steady-state op pays a hash of five integers and, every interval ops, one small
// allgather. What sampling cannot do: stop a mismatched collective after the young phase from
// running (its results are wrong until the next check says so, or it hangs if MPI cannot match
// it: the watchdog's timeout ends that). `1` compares every collective before it runs.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/Config.hpp"
#include "mpi/Comm.hpp"

namespace mpigpu {

// What ranks must agree on for a collective; -1: not part of the check (e.g. alltoall sizes).
struct Fingerprint {
  int64_t type = -1, dtype = -1, numel = -1, root = -1, redop = -1;
  bool operator==(const Fingerprint& o) const {
    return type == o.type && dtype == o.dtype && numel == o.numel && root == o.root &&
           redop == o.redop;
  }
};

Fingerprint fingerprintOf(c10d::OpType type, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, int root, int redop);

// One group's check. onCollective runs inside each collective's task, in issue order (the
// group's ops never run at the same time), before the op touches its tensors.
class DesyncCheck {
 public:
  DesyncCheck(DesyncMode mode, int64_t firstOps, int64_t interval)
      : mode_(mode), firstOps_(firstOps), interval_(interval) {}
  bool enabled() const { return mode_ != DesyncMode::Off; }
  // Throws on every rank of `comm` where ranks differ: on this op (it is then not run), or on an
  // earlier one since the last check (named; it ran).
  void onCollective(const mpi::Comm& comm, const std::string& group, const char* op, uint64_t seq,
                    const Fingerprint& fp);

 private:
  bool due(uint64_t seq) const;
  void reset(uint64_t nextSeq);
  [[noreturn]] void reportEarlier(const mpi::Comm& comm, const std::string& group, const char* op,
                                  uint64_t seq);

  const DesyncMode mode_;
  const int64_t firstOps_, interval_;
  std::mutex mutex_;
  uint64_t digest_ = 0;
  uint64_t since_ = 1;               // the first collective the digest covers
  std::vector<Fingerprint> recent_;  // fingerprints since the last check, from since_ on
};

}  // namespace mpigpu
