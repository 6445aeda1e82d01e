// A node leader's mappings of its peers' allocations (NODE_LEADER=mapped), kept across ops: one
// per process and device, shared by every group of the process.
//
// Opening a peer's allocation (CUDA: cudaIpcOpenMemHandle) may cost a millisecond and closing it
// half that (UCX's profile on a V100, rapidsai/ucx-py#334), more than a whole op on one node. So,
// as UCX's cuda_ipc cache and Open MPI's smcuda do, the leader keeps what it opened, keyed by the
// device it maps into, the owner (a token per process) and the allocation's handle, and opens
// again only on a miss:
//  - A handle names one allocation: where a peer frees an allocation and gets another at the same
//    address, its handle differs (CUDA's cudaIpcGetMemHandle documents this), so a kept mapping is
//    never taken for memory it does not map.
//  - One mapping per handle in the process: a second open of the same handle may be refused
//    (CUDA_ERROR_ALREADY_MAPPED), and two groups may map one tensor.
//  - A mapping an op holds (acquired, not yet released: its device work may still read it) is
//    never closed; the others may be, at any op's end.
//  - A kept mapping of memory its owner freed is never used again, but may hold that memory until
//    closed. So each owner sends, with every op, how many allocations its allocator has given back
//    to the device so far; where that count moved, the owner's mappings no op holds close before
//    this op's are mapped (any of them may be freed memory).
//  - After an op at most `keep` mappings stay, the most recently used; `keep` 0 closes each op's
//    at its end.
// Opens and closes are injected, so the rules run in CPU tests (_C._test_kept_mappings).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace mpigpu::node {

class KeptMappings {
 public:
  using Handle = std::array<uint8_t, 64>;
  // null, with why, where the handle cannot be opened (the caller made `device` current)
  using Open = std::function<void*(const Handle& handle, std::string* why)>;
  // (any group's op may close another device's mappings: `device` is the one it was mapped into)
  using Close = std::function<void(int device, void* mapped)>;

  KeptMappings(Open open, Close close) : open_(std::move(open)), close_(std::move(close)) {}
  KeptMappings(const KeptMappings&) = delete;
  KeptMappings& operator=(const KeptMappings&) = delete;

  // Where `owner`'s allocation `handle` is mapped into `device`, held until release(); null,
  // with why. `ownerFrees`: that owner's count of allocations given back to its device so far.
  void* acquire(int device, uint64_t owner, const uint8_t* handle, uint64_t ownerFrees,
                std::string* why) {
    std::lock_guard<std::mutex> lock(mutex_);
    forgetIfFreed(owner, ownerFrees);
    Handle h;
    std::memcpy(h.data(), handle, h.size());
    for (Entry& e : entries_) {
      if (e.device == device && e.owner == owner && e.handle == h) {
        ++e.holders;
        e.lastUse = ++uses_;
        return e.mapped;
      }
    }
    void* mapped = open_(h, why);
    if (mapped == nullptr) return nullptr;
    opened().fetch_add(1, std::memory_order_relaxed);
    entries_.push_back({device, owner, h, mapped, 1, ++uses_});
    return mapped;
  }

  // An op's end, its device work on `mapped` (what its acquire() calls returned) finished: they
  // are no longer held, and of the mappings no op holds, only the `keep` most recently used stay
  // (a group's release: keep 0).
  void release(const std::vector<void*>& mapped, int64_t keep) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (void* p : mapped)
      for (Entry& e : entries_)
        if (e.mapped == p && e.holders > 0) {
          --e.holders;
          break;
        }
    std::stable_sort(entries_.begin(), entries_.end(),
                     [](const Entry& a, const Entry& b) { return a.lastUse > b.lastUse; });
    int64_t kept = 0;
    closeWhere([&](const Entry& e) { return e.holders == 0 && ++kept > keep; });
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

  // Opens in this process (node_waits()'s mapped_opens).
  static std::atomic<uint64_t>& opened() {
    static std::atomic<uint64_t> count{0};
    return count;
  }

 private:
  struct Entry {
    int device;
    uint64_t owner;
    Handle handle;
    void* mapped;
    int holders;       // ops that acquired it and have not released it
    uint64_t lastUse;  // the acquire count at its last acquire
  };

  template <typename Pred>
  void closeWhere(Pred closes) {
    auto out = entries_.begin();
    for (Entry& e : entries_) {
      if (closes(e))
        close_(e.device, e.mapped);
      else
        *out++ = e;
    }
    entries_.erase(out, entries_.end());
  }

  void forgetIfFreed(uint64_t owner, uint64_t ownerFrees) {
    auto seen = freesSeen_.emplace(owner, ownerFrees);
    if (seen.second || seen.first->second == ownerFrees) return;
    seen.first->second = ownerFrees;
    closeWhere([&](const Entry& e) { return e.owner == owner && e.holders == 0; });
  }

  const Open open_;
  const Close close_;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::map<uint64_t, uint64_t> freesSeen_;  // per owner: its count at its last op here
  uint64_t uses_ = 0;
};

}  // namespace mpigpu::node
