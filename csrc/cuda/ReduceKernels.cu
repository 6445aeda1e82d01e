// Our CUDA reduction kernels (see CombineKernels.hpp). Only ATen's Tensor and c10's CUDA headers
// here: nvcc parses every header twice (device and host), and ATen.h or c10d's Types.hpp cost it
// more than the kernels themselves; the c10d side is cuda/CudaReducer.cpp.
#include "cuda/ReduceKernels.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace mpigpu::cuda {
namespace {

constexpr int kSum = static_cast<int>(Arith::kSum), kProd = static_cast<int>(Arith::kProd),
              kMin = static_cast<int>(Arith::kMin), kMax = static_cast<int>(Arith::kMax),
              kAnd = static_cast<int>(Arith::kAnd), kOr = static_cast<int>(Arith::kOr),
              kXor = static_cast<int>(Arith::kXor);

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T, int A>
__device__ __forceinline__ T apply(T x, T y, Acc<T> scale, bool scaled) {
  if constexpr (std::is_same_v<T, bool>) {
    if constexpr (A == kSum || A == kMax || A == kOr)
      return x || y;
    else if constexpr (A == kXor)
      return x != y;
    else
      return x && y;  // PRODUCT, MIN, BAND
  } else if constexpr (std::is_integral_v<T>) {
    // Unsigned arithmetic at least 32 bits wide: wraps like torch, no undefined behaviour.
    using W = std::conditional_t<(sizeof(T) > 4), uint64_t, uint32_t>;
    using U = std::make_unsigned_t<T>;
    if constexpr (A == kSum)
      return static_cast<T>(static_cast<W>(static_cast<U>(x)) + static_cast<W>(static_cast<U>(y)));
    else if constexpr (A == kProd)
      return static_cast<T>(static_cast<W>(static_cast<U>(x)) * static_cast<W>(static_cast<U>(y)));
    else if constexpr (A == kMin)
      return x < y ? x : y;
    else if constexpr (A == kMax)
      return x > y ? x : y;
    else if constexpr (A == kAnd)
      return x & y;
    else if constexpr (A == kOr)
      return x | y;
    else
      return x ^ y;
  } else {
    const Acc<T> u = static_cast<Acc<T>>(x), v = static_cast<Acc<T>>(y);
    Acc<T> r;
    if constexpr (A == kSum)
      r = u + v;
    else if constexpr (A == kProd)
      r = u * v;
    else if constexpr (A == kMin)
      r = (u < v || u != u) ? u : v;  // NaN propagates, as in torch
    else
      r = (u > v || u != u) ? u : v;
    if (scaled) r *= scale;
    return static_cast<T>(r);
  }
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Grid-stride over packs of V elements (one 16-byte load each), then the tail one by one. `also`
// (null: none) gets the result too; each element is read before either write, so it may be a.
template <typename T, int A, int V>
__global__ void combineKernel(T* dst, T* also, const T* a, const T* b, int64_t n, Acc<T> scale,
                              bool scaled) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<T, V> x = reinterpret_cast<const Pack<T, V>*>(a)[i];
    const Pack<T, V> y = reinterpret_cast<const Pack<T, V>*>(b)[i];
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = apply<T, A>(x.v[k], y.v[k], scale, scaled);
    reinterpret_cast<Pack<T, V>*>(dst)[i] = out;
    if (also != nullptr) reinterpret_cast<Pack<T, V>*>(also)[i] = out;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) {
    const T r = apply<T, A>(a[i], b[i], scale, scaled);
    dst[i] = r;
    if (also != nullptr) also[i] = r;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int multiprocessors(c10::DeviceIndex device) {
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

template <typename T, int A>
void launch(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b, double scale,
            const at::Tensor& also) {
  constexpr int V = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
  const int64_t n = dst.numel();
  if (n == 0) return;
  T* d = static_cast<T*>(dst.data_ptr());
  const T* x = static_cast<const T*>(a.data_ptr());
  const T* y = static_cast<const T*>(b.data_ptr());
  T* both = also.defined() ? static_cast<T*>(also.data_ptr()) : nullptr;
  const bool vector =
      aligned16(d) && aligned16(x) && aligned16(y) && (both == nullptr || aligned16(both));
  const int threads = 256;
  const int64_t units = vector ? (n + V - 1) / V : n;
  const int sms = multiprocessors(dst.device().index());
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((units + threads - 1) / threads, int64_t{sms} * 8)));
  auto stream = c10::cuda::getCurrentCUDAStream(dst.device().index()).stream();
  const bool scaled = scale != 1.0;
  if (vector) {
    combineKernel<T, A, V>
        <<<blocks, threads, 0, stream>>>(d, both, x, y, n, static_cast<Acc<T>>(scale), scaled);
  } else {
    combineKernel<T, A, 1>
        <<<blocks, threads, 0, stream>>>(d, both, x, y, n, static_cast<Acc<T>>(scale), scaled);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void byArithmetic(int arith, const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
                  double scale, const at::Tensor& also) {
  if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, c10::Half> ||
                std::is_same_v<T, c10::BFloat16>) {
    switch (arith) {
      case kSum: return launch<T, kSum>(dst, a, b, scale, also);
      case kProd: return launch<T, kProd>(dst, a, b, scale, also);
      case kMin: return launch<T, kMin>(dst, a, b, scale, also);
      case kMax: return launch<T, kMax>(dst, a, b, scale, also);
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    switch (arith) {
      case kSum:
      case kMax:
      case kOr: return launch<T, kOr>(dst, a, b, scale, also);
      case kXor: return launch<T, kXor>(dst, a, b, scale, also);
      default: return launch<T, kAnd>(dst, a, b, scale, also);
    }
  } else {
    switch (arith) {
      case kSum: return launch<T, kSum>(dst, a, b, scale, also);
      case kProd: return launch<T, kProd>(dst, a, b, scale, also);
      case kMin: return launch<T, kMin>(dst, a, b, scale, also);
      case kMax: return launch<T, kMax>(dst, a, b, scale, also);
      case kAnd: return launch<T, kAnd>(dst, a, b, scale, also);
      case kOr: return launch<T, kOr>(dst, a, b, scale, also);
      case kXor: return launch<T, kXor>(dst, a, b, scale, also);
    }
  }
  TORCH_CHECK(false, "mpigpu: no CUDA reduction ", arith, " for dtype ", dst.scalar_type());
}

}  // namespace

void launchCombine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b, Arith which,
                   double scale, const at::Tensor& also) {
  const int arith = static_cast<int>(which);
  switch (dst.scalar_type()) {
    case at::kFloat: return byArithmetic<float>(arith, dst, a, b, scale, also);
    case at::kDouble: return byArithmetic<double>(arith, dst, a, b, scale, also);
    case at::kHalf: return byArithmetic<c10::Half>(arith, dst, a, b, scale, also);
    case at::kBFloat16: return byArithmetic<c10::BFloat16>(arith, dst, a, b, scale, also);
    case at::kChar: return byArithmetic<int8_t>(arith, dst, a, b, scale, also);
    case at::kByte: return byArithmetic<uint8_t>(arith, dst, a, b, scale, also);
    case at::kShort: return byArithmetic<int16_t>(arith, dst, a, b, scale, also);
    case at::kInt: return byArithmetic<int32_t>(arith, dst, a, b, scale, also);
    case at::kLong: return byArithmetic<int64_t>(arith, dst, a, b, scale, also);
    case at::kUInt16: return byArithmetic<uint16_t>(arith, dst, a, b, scale, also);
    case at::kUInt32: return byArithmetic<uint32_t>(arith, dst, a, b, scale, also);
    case at::kUInt64: return byArithmetic<uint64_t>(arith, dst, a, b, scale, also);
    case at::kBool: return byArithmetic<bool>(arith, dst, a, b, scale, also);
    default: TORCH_CHECK(false, "mpigpu: no CUDA reduction for dtype ", dst.scalar_type());
  }
}

}  // namespace mpigpu::cuda
