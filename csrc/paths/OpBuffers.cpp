#include "paths/OpBuffers.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace mpigpu::paths {

namespace {
std::atomic<uint64_t> g_startWaitNs{0};
std::atomic<uint64_t> g_orderEventsRecorded{0}, g_orderEventsSkipped{0};
}  // namespace
void noteStartWaitSince(std::chrono::steady_clock::time_point start) {
  const auto waited = std::chrono::steady_clock::now() - start;
  g_startWaitNs.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count()),
      std::memory_order_relaxed);
}
uint64_t startWaitNs() { return g_startWaitNs.load(std::memory_order_relaxed); }
void noteOrderEvent(bool recorded) {
  (recorded ? g_orderEventsRecorded : g_orderEventsSkipped).fetch_add(1, std::memory_order_relaxed);
}
OrderEvents orderEvents() {
  return {g_orderEventsRecorded.load(std::memory_order_relaxed),
          g_orderEventsSkipped.load(std::memory_order_relaxed)};
}

size_t OpBuffers::add(std::vector<at::Tensor> users, Access access, bool elementwise) {
  TORCH_INTERNAL_ASSERT(!users.empty(), "mpigpu: a slot needs at least one tensor");
  Slot s;
  s.access = access;
  s.elementwise = elementwise;
  for (const auto& u : users) s.numel += u.numel();
  s.users = std::move(users);
  onAdd(s);
  slots_.push_back(std::move(s));
  return slots_.size() - 1;
}

int64_t OpBuffers::bytes() const {
  int64_t total = 0;
  for (const auto& s : slots_) total += s.numel * static_cast<int64_t>(s.users[0].element_size());
  return total;
}

void OpBuffers::run(size_t slot, c10::function_ref<void(at::Tensor&)> mpiOn) {
  Slot& s = slots_[slot];
  if (s.elementwise)
    runInPieces(s, s.mpi, mpiOn);
  else
    mpiOn(s.mpi);
}

int64_t OpBuffers::pieceNumel(const Slot& s) const {
  if (pieceBytes_ <= 0) return std::max<int64_t>(s.numel, 1);
  return std::max<int64_t>(1, pieceBytes_ / static_cast<int64_t>(s.users[0].element_size()));
}

void OpBuffers::runInPieces(const Slot& s, at::Tensor& flat,
                            c10::function_ref<void(at::Tensor&)> mpiOn) const {
  const int64_t per = pieceNumel(s), numel = flat.numel();
  if (numel <= per) {
    mpiOn(flat);
    return;
  }
  for (int64_t off = 0; off < numel; off += per) {
    at::Tensor piece = flat.narrow(0, off, std::min(per, numel - off));
    mpiOn(piece);
  }
}

at::Tensor OpBuffers::packUsers(const Slot& s) {
  if (s.users.size() == 1) return s.users[0].reshape({-1}).contiguous();
  std::vector<at::Tensor> flat;
  flat.reserve(s.users.size());
  for (const auto& u : s.users) flat.push_back(u.reshape({-1}));
  return at::cat(flat);  // one kernel on devices
}

at::Tensor OpBuffers::adjacentView(const Slot& s) {
  const at::Tensor& first = s.users[0];
  if (s.users.size() < 2 || !first.has_storage()) return {};
  const auto* next = static_cast<const char*>(first.const_data_ptr());
  for (const auto& u : s.users) {
    if (!u.is_contiguous() || !u.has_storage() || !u.storage().is_alias_of(first.storage()) ||
        static_cast<const char*>(u.const_data_ptr()) != next) {
      return {};
    }
    next += u.numel() * static_cast<int64_t>(u.element_size());
  }
  return first.new_empty({0}).set_(first.storage(), first.storage_offset(), {s.numel}, {1});
}

namespace {
// torch 2.11 has no CUDA _foreach_copy_ for uint16/32/64 (seen on the lent H200): those copy as
// the signed type of the same size, which moves the same bits.
at::ScalarType copyableAs(at::ScalarType dtype) {
  switch (dtype) {
    case at::kUInt16: return at::kShort;
    case at::kUInt32: return at::kInt;
    case at::kUInt64: return at::kLong;
    default: return dtype;
  }
}
}  // namespace

void OpBuffers::unpackInto(const at::Tensor& flat, const std::vector<at::Tensor>& users,
                           bool nonBlocking) {
  if (users.size() == 1) {
    users[0].copy_(flat.view(users[0].sizes()), nonBlocking);
    return;
  }
  const at::ScalarType dtype = flat.scalar_type(), as = copyableAs(dtype);
  const auto copyable = [&](const at::Tensor& t) { return as == dtype ? t : t.view(as); };
  std::vector<at::Tensor> targets, pieces;
  targets.reserve(users.size());
  pieces.reserve(users.size());
  int64_t off = 0;
  for (const auto& u : users) {
    targets.push_back(copyable(u));
    pieces.push_back(copyable(flat.narrow(0, off, u.numel()).view(u.sizes())));
    off += u.numel();
  }
  at::_foreach_copy_(targets, pieces, nonBlocking);  // batched on devices where torch can
}

// A host buffer reused by every fused op of one group, so packing many small tensors costs a
// memcpy into memory that is already mapped, not an allocation and page faults per op. Touched
// only by the group's engine thread; regions are handed out per op and given back after it.
struct HostScratch {
  explicit HostScratch(int64_t keepBytes) : keep(keepBytes) {}

  at::Tensor take(int64_t numel, at::ScalarType dtype) {
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t rounded = (bytes + 63) / 64 * 64;
    if (used + rounded > keep) return at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (!buffer.defined() || buffer.numel() < used + rounded) {
      // Earlier regions of this op keep the old buffer alive through their views.
      buffer = at::empty({std::min(keep, std::max<int64_t>(2 * (used + rounded), 1 << 20))},
                         at::TensorOptions().dtype(at::kByte));
      used = 0;
    }
    at::Tensor region = buffer.narrow(0, used, bytes).view(dtype);
    used += rounded;
    return region;
  }

  at::Tensor buffer;
  int64_t used = 0;
  const int64_t keep;
};

namespace {

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// A contiguous tensor as the 1-D buffer MPI and the algorithms see. Most are 1-D already (DDP
// buckets, flat parameters) and are used as they are; a view through the dispatcher's autograd
// layer costs about a microsecond, a large part of a small op, and the buffer never meets
// autograd, so other shapes are viewed below it.
at::Tensor flatAlias(const at::Tensor& t) {
  if (t.dim() == 1) return t;
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  return t.view({-1});
}

// An empty tensor's data pointer may be null, and memcpy from or to null is undefined even for
// 0 bytes (UBSan reports it).
void copyBytes(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

// memcpy for contiguous host tensors: no per-tensor op dispatch when a bucket holds thousands.
void packHost(const std::vector<at::Tensor>& users, const at::Tensor& flat) {
  auto* dst = static_cast<char*>(flat.data_ptr());
  int64_t off = 0;
  for (const auto& u : users) {
    if (u.is_contiguous())
      copyBytes(dst, u.const_data_ptr(), nbytes(u));
    else
      flat.narrow(0, off, u.numel()).view(u.sizes()).copy_(u);
    dst += nbytes(u);
    off += u.numel();
  }
}

void unpackHost(const at::Tensor& flat, const std::vector<at::Tensor>& users) {
  const auto* src = static_cast<const char*>(flat.const_data_ptr());
  int64_t off = 0;
  for (const auto& u : users) {
    if (u.is_contiguous())
      copyBytes(u.data_ptr(), src, nbytes(u));
    else
      u.copy_(flat.narrow(0, off, u.numel()).view(u.sizes()));
    src += nbytes(u);
    off += u.numel();
  }
}

// cpu and via-cpu: host memory. Device tensors (via-cpu) are copied on the caller's thread at
// issue, so they are read in stream order (.to(kCPU) waits for the producer); results are written
// back on the engine. Several host tensors in one slot are packed on the engine into the group's
// reused buffer (or used in place when they already lie back to back).
class HostOpBuffers final : public OpBuffers {
 public:
  HostOpBuffers(at::Device device, std::shared_ptr<HostScratch> scratch)
      : OpBuffers(device.is_cpu() ? "cpu" : "via-cpu", device), scratch_(std::move(scratch)) {}

  bool onCallerMemory() const override { return device_.is_cpu(); }

  void stageIn() override {
    scratch_->used = 0;
    for (auto& s : slots_) {
      if (s.deferred && !s.elementwise) fill(s);
    }
  }

  void run(size_t slot, c10::function_ref<void(at::Tensor&)> mpiOn) override {
    Slot& s = slots_[slot];
    if (!s.deferred || !s.elementwise) {
      OpBuffers::run(slot, mpiOn);
      return;
    }
    // One bucket at a time through the reused buffer: pack, MPI, unpack, give the region back.
    const int64_t mark = scratch_->used;
    fill(s);
    runInPieces(s, s.mpi, mpiOn);
    if (s.writable()) unpackHost(s.mpi, s.users);
    s.mpi = at::Tensor();
    scratch_->used = mark;
  }

  void stageOut() override {
    for (auto& s : slots_) {
      if (!s.writable() || s.aliased || (s.deferred && s.elementwise)) continue;
      if (s.deferred)
        unpackHost(s.mpi, s.users);
      else
        unpackInto(s.mpi, s.users, /*nonBlocking=*/false);
    }
  }

 protected:
  void onAdd(Slot& s) override {
    const bool onHost = s.users[0].is_cpu();
    if (onHost && s.singleContiguous()) {
      s.mpi = flatAlias(s.users[0]);  // MPI uses the caller's memory itself
      s.aliased = true;
      return;
    }
    if (onHost && s.users.size() > 1) {
      s.mpi = adjacentView(s);
      s.aliased = s.mpi.defined();
      s.deferred = !s.aliased;
      return;
    }
    if (!s.readable()) {
      s.mpi = at::empty({s.numel}, s.users[0].options().device(at::kCPU));
      return;
    }
    if (onHost) {
      s.mpi = packUsers(s);
      return;
    }
    std::vector<at::Tensor> host;
    for (const auto& u : s.users) host.push_back(u.to(at::kCPU).reshape({-1}));
    s.mpi = host.size() == 1 ? host[0].contiguous() : at::cat(host);
  }

 private:
  void fill(Slot& s) {
    s.mpi = scratch_->take(s.numel, s.users[0].scalar_type());
    if (s.readable()) packHost(s.users, s.mpi);
  }

  std::shared_ptr<HostScratch> scratch_;
};

}  // namespace

std::shared_ptr<HostScratch> makeHostScratch(int64_t keepBytes) {
  return std::make_shared<HostScratch>(keepBytes);
}

std::shared_ptr<OpBuffers> makeHostOpBuffers(const at::Device& device,
                                             const std::shared_ptr<HostScratch>& scratch) {
  return std::make_shared<HostOpBuffers>(device, scratch);
}

}  // namespace mpigpu::paths
