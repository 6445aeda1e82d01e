// The node's leader's mappings of its peers' allocations (NODE_LEADER=mapped), kept across ops.
//
// Opening a peer's allocation (CUDA: cudaIpcOpenMemHandle) may cost a millisecond and closing it
// half that (UCX's profile on a V100, rapidsai/ucx-py#334), more than a whole op on one node. So,
// as UCX's cuda_ipc cache and Open MPI's smcuda do, the leader keeps what it opened, keyed by the
// peer and the allocation's handle, and opens again only on a miss:
//  - A handle names one allocation: where a peer frees an allocation and gets another at the same
//    address, its handle differs (CUDA's cudaIpcGetMemHandle documents this), so a kept mapping is
//    never taken for memory it does not map.
//  - A kept mapping of memory the peer has freed is never used again, but may hold that memory
//    until closed. So each peer sends, with every op, how many allocations its allocator has given
//    back to the device so far; where that count moved, the leader closes that peer's mappings
//    this op does not use (any of them may be freed memory), before it maps this op's.
//  - At most `keep` mappings stay after an op, the most recently used; `keep` 0 closes each
//    op's at its end.
// Not thread-safe: the leader's op thread alone calls it. Opens and closes are injected, so the
// rules run in CPU tests (torch_mpi_gpu._C._test_kept_mappings).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mpigpu::node {

class KeptMappings {
 public:
  using Handle = std::array<uint8_t, 64>;
  // null, with why, where the handle cannot be opened
  using Open = std::function<void*(int peer, const Handle& handle, std::string* why)>;
  using Close = std::function<void(void* mapped)>;

  KeptMappings(int64_t keep, Open open, Close close)
      : keep_(std::max<int64_t>(keep, 0)), open_(std::move(open)), close_(std::move(close)) {}
  ~KeptMappings() { closeAll(); }
  KeptMappings(const KeptMappings&) = delete;
  KeptMappings& operator=(const KeptMappings&) = delete;

  // Where local rank `peer`'s allocation `handle` is mapped here, for this op; null, with why.
  // `peerFrees`: that peer's count of allocations given back to its device so far.
  void* map(int peer, const uint8_t* handle, uint64_t peerFrees, std::string* why) {
    forgetIfFreed(peer, peerFrees);
    Handle h;
    std::memcpy(h.data(), handle, h.size());
    for (Entry& e : entries_) {
      if (e.peer == peer && e.handle == h) {
        e.lastOp = op_;
        return e.mapped;
      }
    }
    void* mapped = open_(peer, h, why);
    if (mapped == nullptr) return nullptr;
    opened().fetch_add(1, std::memory_order_relaxed);
    entries_.push_back({peer, h, mapped, op_});
    return mapped;
  }

  // The op is over and this process's device work on its mappings has finished: the `keep` most
  // recently used stay open, the rest close.
  void endOp() {
    if (static_cast<int64_t>(entries_.size()) > keep_) {
      std::stable_sort(entries_.begin(), entries_.end(),
                       [](const Entry& a, const Entry& b) { return a.lastOp > b.lastOp; });
      for (size_t i = keep_; i < entries_.size(); ++i) close_(entries_[i].mapped);
      entries_.resize(keep_);
    }
    ++op_;
  }

  // Closes every mapping (the slots' release: no device work of this process is left).
  void closeAll() {
    for (const Entry& e : entries_) close_(e.mapped);
    entries_.clear();
  }

  size_t size() const { return entries_.size(); }

  // Opens in this process, every group (node_waits()'s mapped_opens).
  static std::atomic<uint64_t>& opened() {
    static std::atomic<uint64_t> count{0};
    return count;
  }

 private:
  struct Entry {
    int peer;
    Handle handle;
    void* mapped;
    uint64_t lastOp;
  };

  void forgetIfFreed(int peer, uint64_t peerFrees) {
    if (peer >= static_cast<int>(freesSeen_.size())) freesSeen_.resize(peer + 1, 0);
    if (freesSeen_[peer] == peerFrees) return;
    freesSeen_[peer] = peerFrees;
    auto stale = [&](const Entry& e) { return e.peer == peer && e.lastOp != op_; };
    for (const Entry& e : entries_)
      if (stale(e)) close_(e.mapped);
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), stale), entries_.end());
  }

  const int64_t keep_;
  const Open open_;
  const Close close_;
  std::vector<Entry> entries_;
  std::vector<uint64_t> freesSeen_;  // per peer: its count at its last op here (0 before any)
  uint64_t op_ = 0;
};

}  // namespace mpigpu::node
