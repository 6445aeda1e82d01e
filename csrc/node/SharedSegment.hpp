// A group's shared-memory segment on one node: per rank two slots (alternate halves, so one
// barrier per step is enough: a slot is rewritten two steps later, after every peer has passed
// the barrier in between) and an arrival counter. Ranks reach each other's slots by plain loads
// and stores; `sync` is the only ordering between them.
// A rank may also publish a buffer of its own that its peers then read in place, by the kernel
// (readPublished: Linux cross-memory attach), where the ptrace rules allow it (probeSingleCopy).
//
// POSIX shared memory, not an MPI-3 shared window: the name is unlinked as soon as every rank has
// mapped it, so nothing is left in /dev/shm whatever happens to the job later (a killed rank,
// MPI_Abort), and the pages are reserved up front (posix_fallocate), so a full /dev/shm is an
// error at creation rather than a SIGBUS in the middle of an op.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpi/Collectives.hpp"

namespace mpigpu::node {

class SharedSegment {
 public:
  // Collective over `nodeComm`. Null, with the reason in `why`, when this rank could not map it
  // (the caller agrees with the other ranks before anyone uses it).
  static std::unique_ptr<SharedSegment> create(const mpi::Comm& nodeComm, int64_t slotBytes,
                                               const char* op, int rankForErrors, std::string* why);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  int64_t slotBytes() const { return slotBytes_; }
  int localRank() const { return localRank_; }
  int localSize() const { return localSize_; }
  // `elems` elements of `dtype` at the start of `rank`'s slot in the current half.
  at::Tensor slot(int rank, at::ScalarType dtype, int64_t elems) const;
  // The same slot's first byte (small ops skip building tensors).
  uint8_t* slotData(int rank) const {
    return base_ + headerBytes_ + (2 * static_cast<size_t>(rank) + half_) * slotBytes_;
  }
  // Barrier over the node's ranks: this rank's arrival, then every peer's. Spins briefly (not
  // at all for a peer last seen on this CPU), then yields, then sleeps, so oversubscribed ranks
  // make progress. A peer whose process has gone is an error naming `op`, not a hang.
  // `cancelled` (checked with the peers' liveness): the group was aborted, give up waiting.
  void sync(const char* op, int rankForErrors, const std::atomic<bool>& cancelled);
  // This rank gives up on the group (a process failure elsewhere): its peers' waits for it in
  // sync() end with an error within 200 ms.
  void giveUp();
  // Waits (in this process) that yielded at once because the peer had last run on this CPU.
  static uint64_t yieldsToPeerOnThisCpu();
  // The other half: the next step's slots.
  void flip() { half_ ^= 1; }

  // ---- single copy: ranks read each other's buffers in place (Linux cross-memory attach) ----
  // "" where this rank can read every peer's memory (process_vm_readv, tried on the token each
  // rank published at creation), else why not. Call before any op publishes; agree on it.
  std::string probeSingleCopy() const;
  // `data` becomes what the peers read: publish it before a sync, keep it unchanged until the
  // next sync (after which the peers have finished reading).
  void publish(const void* data);
  // Copies `bytes` from `offset` past what local rank `rank` published into `dst`: one copy, by
  // the kernel, no slot in between. An error names `op`, and says what to set.
  void readPublished(int rank, void* dst, int64_t offset, int64_t bytes, const char* op,
                     int rankForErrors) const;
  // readPublished calls so far in this process.
  static uint64_t singleCopyReads();

  struct Peer;  // a rank's entry in the header

 private:
  SharedSegment() = default;
  Peer* peer(int rank) const;
  // Whether `rank`'s pid names that process here (the same PID namespace as this rank's).
  bool seesPid(int rank) const;
  void checkAlive(int rank, const char* op, int rankForErrors) const;

  uint8_t* base_ = nullptr;
  size_t mappedBytes_ = 0;
  int64_t slotBytes_ = 0;
  size_t headerBytes_ = 0;
  int localRank_ = 0, localSize_ = 1;
  int half_ = 0;
  // Spins before yielding: none where the node's ranks outnumber its cores (a spinning rank
  // would hold the core its peer needs until the scheduler's tick).
  uint64_t spinLimit_ = 2000;
  uint64_t epoch_ = 0;         // syncs so far: the same on every rank of the node
  uint64_t probeToken_ = 0;    // what probeSingleCopy's peers read
  uint64_t pidNamespace_ = 0;  // this process's (Peer::pidNamespace)
};

}  // namespace mpigpu::node
