// Building blocks shared by the algorithms (Algorithms.cpp, NodeAlgorithms.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdint>

#include "algorithms/Context.hpp"

namespace mpigpu::algo {

// n elements cut into k blocks whose sizes differ by at most one.
struct Blocks {
  int64_t n;
  int k;
  int64_t offset(int b) const { return b * (n / k) + std::min<int64_t>(b, n % k); }
  int64_t length(int b) const { return offset(b + 1) - offset(b); }
};

inline int mod(int a, int p) { return ((a % p) + p) % p; }

// Calls f(offset, count) for consecutive pieces of [0, len): the same cut on every rank, so
// sender and receiver agree on each message.
template <typename F>
void forPieces(int64_t len, int64_t piece, F&& f) {
  for (int64_t off = 0; off < len; off += piece) f(off, std::min(piece, len - off));
}

// AVG's division, applied by the step that finishes a block.
inline double finalScale(const Context& c, int size) {
  return c.red.divideBySize ? 1.0 / size : 1.0;
}

// PREMUL_SUM: every rank's input times its factor, before anything is summed. In place when the
// buffer is the op's own result; else a copy, so the caller's input is left as it was.
inline at::Tensor prescale(const Context& c, const at::Tensor& in, bool inPlace) {
  if (!c.red.needsPrescale()) return in;
  at::NoGradGuard noGrad;
  at::Tensor factor = c.red.premulTensor.defined()
                          ? c.red.premulTensor.to(in.device(), in.scalar_type())
                          : at::scalar_tensor(*c.red.premulScalar, in.options());
  if (inPlace) return in.mul_(factor);
  return in * factor;
}

}  // namespace mpigpu::algo
