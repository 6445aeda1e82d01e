#include "cuda/NodeBarrier.hpp"

namespace mpigpu::cuda {
namespace {

// System scope: the peers are other processes, on this GPU or on others through peer access.
__device__ __forceinline__ void storeRelease(unsigned long long* p, unsigned long long v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(p) = v;
#endif
}

__device__ __forceinline__ unsigned long long loadAcquire(const unsigned long long* p) {
  unsigned long long v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
  v = *reinterpret_cast<const volatile unsigned long long*>(p);
  __threadfence_system();
#endif
  return v;
}

__device__ __forceinline__ unsigned long long nowNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One block, a thread per local rank j: thread j marks this rank's arrival in j's flags, then
// waits for j's arrival in this rank's flags.
__global__ void nodeBarrierKernel(NodeBarrierArgs a) {
  __shared__ unsigned long long k;
  if (threadIdx.x == 0) {
    k = *a.count + 1;
    *a.count = k;
  }
  __syncthreads();
  const int j = threadIdx.x;
  if (j < a.localSize) {
    storeRelease(a.flags[j] + a.localRank, k);
    const unsigned long long* theirs = a.flags[a.localRank] + j;
    const unsigned long long start = nowNs();
    const volatile unsigned long long* cancelled = a.cancelled;
    while (loadAcquire(theirs) < k) {
      if (*cancelled != 0) break;  // the group was aborted: nobody else is coming
      if (nowNs() - start > a.timeoutNs) {
        // host memory: a plain store (atomics there need a platform that supports them)
        volatile unsigned long long* gaveUp = a.gaveUp;
        if (*gaveUp == 0) *gaveUp = k;
        __threadfence_system();
        break;
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
      __nanosleep(64);
#endif
    }
  }
  // every thread's acquire is ordered before the kernels queued after this one
  __syncthreads();
}

}  // namespace

cudaError_t queueNodeBarrier(const NodeBarrierArgs& args, cudaStream_t stream) {
  const int threads = (args.localSize + 31) / 32 * 32;
  nodeBarrierKernel<<<1, threads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace mpigpu::cuda
