#include "cuda/StreamBarrier.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/StringUtil.h>
#include <cuda.h>

#include "cuda/DriverApi.hpp"

namespace mpigpu::cuda {
namespace {

using StreamValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

// The driver's stream memory operations (cuda/DriverApi.hpp).
struct StreamMemOps {
  StreamValue64 write = nullptr;
  StreamValue64 wait = nullptr;
  std::string missing;  // why not, where they are null
};

const StreamMemOps& streamMemOps() {
  static const StreamMemOps ops = [] {
    StreamMemOps o;
    for (auto [symbol, fn] :
         {std::pair{"cuStreamWriteValue64", &o.write}, std::pair{"cuStreamWaitValue64", &o.wait}}) {
      *fn = reinterpret_cast<StreamValue64>(driverFunction(symbol, &o.missing));
      if (*fn == nullptr) return StreamMemOps{nullptr, nullptr, o.missing};
    }
    return o;
  }();
  return ops;
}

CUdeviceptr address(const unsigned long long* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

std::string streamWaitsUnavailable(int device) {
  const StreamMemOps& ops = streamMemOps();
  if (!ops.missing.empty()) return ops.missing;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  unsigned long long* word = nullptr;
  cudaStream_t stream = nullptr;
  std::string why;
  if (cudaMalloc(reinterpret_cast<void**>(&word), sizeof(*word)) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    why = c10::str("could not try stream waits: ", cudaGetErrorString(cudaGetLastError()));
  } else {
    CUresult r = CUDA_SUCCESS;
    if (cudaMemsetAsync(word, 0, sizeof(*word), stream) != cudaSuccess ||
        (r = ops.write(stream, address(word), 1, CU_STREAM_WRITE_VALUE_DEFAULT)) != CUDA_SUCCESS ||
        (r = ops.wait(stream, address(word), 1, CU_STREAM_WAIT_VALUE_GEQ)) != CUDA_SUCCESS ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      why = c10::str("a 64-bit stream write and wait failed here (CUresult ", static_cast<int>(r),
                     ", ", cudaGetErrorString(cudaGetLastError()), ")");
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (word != nullptr) cudaFree(word);
  return why;
}

StreamBarrier::StreamBarrier(int device, std::vector<unsigned long long*> flags, int localRank,
                             std::chrono::nanoseconds timeout, volatile unsigned long long* gaveUp)
    : device_(device),
      flags_(std::move(flags)),
      localRank_(localRank),
      timeout_(timeout),
      gaveUp_(gaveUp) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  int flush = 0;
  // (a peer on another GPU writes into this one's memory: seen by the work after the wait)
  if (cudaDeviceGetAttribute(&flush, cudaDevAttrCanFlushRemoteWrites, device_) != cudaSuccess)
    (void)cudaGetLastError();
  waitFlags_ = CU_STREAM_WAIT_VALUE_GEQ | (flush ? CU_STREAM_WAIT_VALUE_FLUSH : 0);
  if (cudaStreamCreateWithFlags(&releaseStream_, cudaStreamNonBlocking) != cudaSuccess) {
    unavailable_ = c10::str("cudaStreamCreate: ", cudaGetErrorString(cudaGetLastError()));
    releaseStream_ = nullptr;
  }
}

StreamBarrier::~StreamBarrier() {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  for (const InFlight& f : inFlight_) cudaEventDestroy(f.done);
  for (cudaEvent_t e : spareEvents_) cudaEventDestroy(e);
  if (releaseStream_ != nullptr) cudaStreamDestroy(releaseStream_);
}

std::string StreamBarrier::queue(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  pollLocked();
  const StreamMemOps& ops = streamMemOps();
  const unsigned long long k = ++count_;
  const int n = static_cast<int>(flags_.size());
  for (int j = 0; j < n; ++j) {
    if (j == localRank_) continue;
    const CUresult r =
        ops.write(stream, address(flags_[j] + localRank_), k, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != CUDA_SUCCESS)
      return c10::str("cuStreamWriteValue64 into local rank ", j, ": CUresult ", r);
  }
  for (int j = 0; j < n; ++j) {
    if (j == localRank_) continue;
    const CUresult r = ops.wait(stream, address(flags_[localRank_] + j), k, waitFlags_);
    if (r != CUDA_SUCCESS)
      return c10::str("cuStreamWaitValue64 for local rank ", j, ": CUresult ", r);
  }
  cudaEvent_t done = nullptr;
  if (!spareEvents_.empty()) {
    done = spareEvents_.back();
    spareEvents_.pop_back();
  } else if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
    return c10::str("cudaEventCreate: ", cudaGetErrorString(cudaGetLastError()));
  }
  if (cudaEventRecord(done, stream) != cudaSuccess) {
    cudaEventDestroy(done);
    return c10::str("cudaEventRecord: ", cudaGetErrorString(cudaGetLastError()));
  }
  inFlight_.push_back({k, done, std::chrono::steady_clock::now()});
  return "";
}

void StreamBarrier::poll() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (retired_ || inFlight_.empty()) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  pollLocked();
}

// Reaps the barriers passed; the oldest still waiting past the timeout gives up: recorded (the
// first only) and this rank's waits released, again at each look while it waits (a late peer's
// arrival may have overwritten the release).
void StreamBarrier::pollLocked() {
  while (!inFlight_.empty()) {
    InFlight& f = inFlight_.front();
    const cudaError_t e = cudaEventQuery(f.done);
    if (e == cudaSuccess) {
      spareEvents_.push_back(f.done);
      inFlight_.pop_front();
      continue;
    }
    (void)cudaGetLastError();  // not ready is no error (as torch's CUDAEvent::query clears it)
    if (e == cudaErrorNotReady && std::chrono::steady_clock::now() - f.queued > timeout_) {
      if (*gaveUp_ == 0) *gaveUp_ = f.k;
      releaseLocked();
    }
    return;
  }
}

void StreamBarrier::release() {
  std::lock_guard<std::mutex> lock(mutex_);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  releaseLocked();
}

// This rank's words in its own flags set far ahead of any barrier to come (the waits compare
// circularly: ahead by less than 2^63), on a stream of its own: the op's stream is blocked.
void StreamBarrier::releaseLocked() {
  if (retired_) return;
  const unsigned long long ahead = count_ + (1ULL << 62);
  const int n = static_cast<int>(flags_.size());
  for (int j = 0; j < n; ++j) {
    if (j == localRank_) continue;
    if (streamMemOps().write(releaseStream_, address(flags_[localRank_] + j), ahead,
                             CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS)
      (void)cudaGetLastError();  // best effort: the op's own error, or the timeout's, reports it
  }
}

void StreamBarrier::retire() {
  std::lock_guard<std::mutex> lock(mutex_);
  retired_ = true;
}

}  // namespace mpigpu::cuda
