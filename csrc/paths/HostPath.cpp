#include "paths/HostPath.hpp"

namespace mpigpu::paths {
namespace {

bool usableInPlace(const at::Tensor& t) { return t.is_cpu() && t.is_contiguous(); }

at::Tensor hostCopy(const at::Tensor& t) {
  // .to(kCPU) from a device waits for the producer on the current stream, so MPI reads final data.
  return t.is_cpu() ? t.contiguous().view(-1) : t.to(at::kCPU).contiguous().view(-1);
}

} // namespace

HostBuffer forInput(const at::Tensor& t) {
  if (usableInPlace(t)) return {t, t.view(-1), false};
  return {t, hostCopy(t), false};
}

HostBuffer forInOut(const at::Tensor& t) {
  if (usableInPlace(t)) return {t, t.view(-1), false};
  return {t, hostCopy(t), true};
}

HostBuffer forOutput(const at::Tensor& t) {
  if (usableInPlace(t)) return {t, t.view(-1), false};
  return {t, at::empty({t.numel()}, t.options().device(at::kCPU)), true};
}

} // namespace mpigpu::paths
