// A device of its own for the tests, on torch's PrivateUse1 mechanism: host memory behind a device
// type that is neither CPU nor CUDA, so mpigpu's path for other devices (XPU and the like) runs
// for real. Allocation, the empty/view/copy kernels a device must provide, a device guard, and
// every other op through torch's CPU fallback. Built and loaded by tests/mp/own_device.py, which
// names the device `owndev`.
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace {

std::atomic<int64_t> g_allocations{0};  // read by the tests (the device really was used)

void freeHost(void* p) { c10::free_cpu(p); }

struct HostBackedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    ++g_allocations;
    return {data, data, &freeHost, c10::Device(c10::DeviceType::PrivateUse1, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &freeHost; }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    std::memcpy(dest, src, count);
  }
};

HostBackedAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

// One device, one stream: the memory is the host's, every op is synchronous.
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device) const override {
    return {c10::DeviceType::PrivateUse1, 0};
  }
  c10::Device getDevice() const override { return {c10::DeviceType::PrivateUse1, 0}; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// What torch asks of the accelerator (it is one, once registered: dist.barrier() allocates there).
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  at::Device getDeviceFromPtr(void*) const override { return {c10::DeviceType::PrivateUse1, 0}; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::DataPtr fresh = g_allocator.allocate(newsize);
    std::memcpy(fresh.get(), storage.data(), std::min(newsize, storage.nbytes()));
    storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
    storage.unsafeGetStorageImpl()->set_nbytes(newsize);
  }
};
const bool g_hooks = (at::RegisterPrivateUse1HooksInterface(new Hooks()), true);

at::Tensor emptyMemoryFormat(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout>, std::optional<c10::Device>,
                             std::optional<bool>, std::optional<c10::MemoryFormat> format) {
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                        std::optional<c10::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// The same bytes seen as a CPU tensor: copies between the device and the host (either way, any
// strides and dtypes) are CPU copies of aliases.
at::Tensor hostAlias(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool) {
  hostAlias(dst).copy_(hostAlias(self));
  return dst;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copyFrom(self, dst, false);
}

at::Scalar localScalarDense(const at::Tensor& self) { return hostAlias(self).item(); }

at::Tensor asStrided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                     std::optional<c10::SymInt> offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(offset));
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<c10::MemoryFormat> format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), format);
}

at::Tensor& setStorage(at::Tensor& self, c10::Storage source, c10::SymInt offset,
                       c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::cpu::set__symint(self, source, offset, size, stride);
}

void cpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack);
}

int64_t allocations() { return g_allocations.load(); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", emptyMemoryFormat);
  m.impl("empty_strided", emptyStrided);
  m.impl("_copy_from", copyFrom);
  m.impl("_copy_from_and_resize", copyFromAndResize);
  m.impl("_local_scalar_dense", localScalarDense);
  m.impl("as_strided", asStrided);
  m.impl("resize_", resize);
  m.impl("set_.source_Storage_storage_offset", setStorage);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  // views each backend registers itself (the CPU fallback would return copies, not views)
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpuFallback>());
}

TORCH_LIBRARY(mpigpu_test_device, m) { m.def("allocations() -> int", &allocations); }
