// The node algorithm's barrier waited for by the GPU's streams themselves
// (TORCH_MPIGPU_NODE_DEVICE_ORDER=stream; node/DeviceSlots.hpp). The same flags as NodeBarrier's
// kernel (a word per local rank in each rank's device memory, mapped into its peers by CUDA
// IPC): at barrier k a rank's stream writes k into its word in every peer's flags
// (cuStreamWriteValue64, after a system-wide fence: the writes queued before it come first), then
// waits until every peer's word in its own flags reaches k (cuStreamWaitValue64). No kernel runs
// while a peer is late, and the host never waits: where processes share a GPU, a stream blocked
// on a wait can leave the GPU to the others, where a kernel that spins holds it for its whole
// time slice. The count k is the host's (ops inside a CUDA graph capture are refused anyway).
//
// A peer that never arrives: nothing on the device gives up by itself, so the watchdog's thread
// (engine/Watchdog.hpp: Poller) and every op's start look at the barriers in flight; one past the
// timeout is recorded where IpcSlots::checkBarriers reads it, and this rank's waits are released
// (their words set far ahead), as abort() releases them at once.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "engine/Watchdog.hpp"

namespace mpigpu::cuda {

// "" where this process's CUDA driver queues 64-bit stream writes and waits on `device` (tried
// there); else why not.
std::string streamWaitsUnavailable(int device);

class StreamBarrier final : public Watchdog::Poller {
 public:
  // flags[j]: local rank j's flags as mapped in this process; `gaveUp`: the host word
  // checkBarriers reads (the number of the first barrier that gave up).
  StreamBarrier(int device, std::vector<unsigned long long*> flags, int localRank,
                std::chrono::nanoseconds timeout, volatile unsigned long long* gaveUp);
  ~StreamBarrier() override;
  StreamBarrier(const StreamBarrier&) = delete;
  StreamBarrier& operator=(const StreamBarrier&) = delete;

  // "" once made; else why it cannot serve (its release needs a stream of its own).
  const std::string& unavailable() const { return unavailable_; }
  // Queues the next barrier on `stream`; "" or the CUDA error.
  std::string queue(cudaStream_t stream);
  // A barrier past its timeout gives up (any thread).
  void poll() override;
  // abort(): this rank's waits pass, those queued and those to come (any thread).
  void release();
  // The slots go: nothing here touches the flags any more.
  void retire();

 private:
  struct InFlight {
    unsigned long long k;
    cudaEvent_t done;
    std::chrono::steady_clock::time_point queued;
  };
  void pollLocked();
  void releaseLocked();

  std::mutex mutex_;
  const int device_;
  const std::vector<unsigned long long*> flags_;
  const int localRank_;
  const std::chrono::nanoseconds timeout_;
  volatile unsigned long long* const gaveUp_;
  unsigned int waitFlags_ = 0;
  unsigned long long count_ = 0;
  std::deque<InFlight> inFlight_;
  std::vector<cudaEvent_t> spareEvents_;
  cudaStream_t releaseStream_ = nullptr;
  std::string unavailable_;
  bool retired_ = false;
};

}  // namespace mpigpu::cuda
