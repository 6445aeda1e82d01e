#include "cuda/IpcSlots.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/StringUtil.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "core/Errors.hpp"
#include "algorithms/Reducer.hpp"
#include "cuda/CudaReducer.hpp"
#include "cuda/NodeBarrier.hpp"
#include "mpi/Check.hpp"

namespace mpigpu::cuda {
namespace {

std::string cudaText(cudaError_t e) {
  cudaGetLastError();  // the error is reported here, not left for the next CUDA call
  return cudaGetErrorString(e);
}

class IpcSlots final : public node::DeviceSlots {
 public:
  IpcSlots(at::Device device, int64_t slotBytes, int localRank, int localSize)
      : peers_(localSize, nullptr),
        peerFlags_(localSize, nullptr),
        device_(device),
        slotBytes_(slotBytes),
        localRank_(localRank) {}
  ~IpcSlots() override {
    c10::cuda::CUDAGuard guard(device_);
    unmapAll();
    if (own_ != nullptr) cudaFree(own_);
    if (ownFlags_ != nullptr) cudaFree(ownFlags_);
    if (gaveUp_ != nullptr) cudaFreeHost(gaveUp_);
  }
  IpcSlots(const IpcSlots&) = delete;
  IpcSlots& operator=(const IpcSlots&) = delete;

  at::Device device() const override { return device_; }
  int64_t slotBytes() const override { return slotBytes_; }
  at::Tensor slot(int rank, at::ScalarType dtype, int64_t elems) const override {
    uint8_t* base = static_cast<uint8_t*>(peers_.at(rank)) + half_ * slotBytes_;
    return at::from_blob(base, {elems}, at::TensorOptions().dtype(dtype).device(device_));
  }
  void flip() override { half_ ^= 1; }
  void settle() const override { c10::cuda::getCurrentCUDAStream(device_.index()).synchronize(); }
  std::unique_ptr<algo::Reducer> reducer(c10d::ReduceOp::RedOpType kind) const override {
    return makeCudaReducer(kind);
  }

  bool ordersOnDevice() const override { return onDevice_; }
  void barrier(const char* op, int rank) override {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    const cudaError_t e = queueNodeBarrier(barrierArgs_, stream);
    if (e != cudaSuccess)
      MPIGPU_THROW_BACKEND(op, rank, "could not queue the node's device barrier: ", cudaText(e),
                           " (TORCH_MPIGPU_NODE_DEVICE_ORDER=host orders from the host)");
  }
  void checkBarriers(const char* op, int rank) const override {
    if (gaveUp_ == nullptr) return;
    const unsigned long long k = *static_cast<volatile unsigned long long*>(gaveUp_);
    if (k != 0)
      MPIGPU_THROW_BACKEND(op, rank, "device barrier #", k, " of this node gave up after ",
                           barrierArgs_.timeoutNs / 1000000000ULL,
                           " s: a rank of the node did not reach it (it died, stalled, or issued "
                           "other ops); the results of that op are wrong and the job should be "
                           "restarted");
  }
  std::string ordering() const override { return ordering_; }
  void cancel() override {
    if (gaveUp_ != nullptr) static_cast<volatile unsigned long long*>(gaveUp_)[1] = 1;
  }

  void release() override {
    c10::cuda::CUDAGuard guard(device_);
    // every kernel of this process that reads or writes a peer's memory
    cudaDeviceSynchronize();
    cudaGetLastError();
    unmapAll();
  }

  // this rank's allocation: both halves
  void* own_ = nullptr;
  // every local rank's allocation as mapped here (own_ at localRank_)
  std::vector<void*> peers_;
  // device ordering: this rank's flags (a word per local rank, then its barrier count), every
  // local rank's as mapped here, and the host-mapped word a barrier that gives up writes
  unsigned long long* ownFlags_ = nullptr;
  std::vector<void*> peerFlags_;
  unsigned long long* gaveUp_ = nullptr;
  bool onDevice_ = false;
  std::string ordering_ = "ordered from the host";
  NodeBarrierArgs barrierArgs_{};

  // The group goes (no device work of this process touches its peers' memory any more): every
  // peer's buffer and flags unmapped.
  void unmapAll() {
    for (size_t r = 0; r < peers_.size(); ++r) {
      if (static_cast<int>(r) == localRank_) continue;
      if (peers_[r] != nullptr) cudaIpcCloseMemHandle(peers_[r]);
      if (peerFlags_[r] != nullptr) cudaIpcCloseMemHandle(peerFlags_[r]);
      peers_[r] = peerFlags_[r] = nullptr;
    }
  }

 private:
  const at::Device device_;
  const int64_t slotBytes_;
  const int localRank_;
  int half_ = 0;
};

// What each rank sends its node: its buffer's handle (and its flags', for device ordering) and
// where that buffer lives.
struct Exported {
  cudaIpcMemHandle_t handle;
  cudaIpcMemHandle_t flagsHandle;
  char pciBusId[32];
  int ok;
  int flagsOk;
};

// This rank's buffer, allocated and exported; "" on success.
std::string exportOwn(IpcSlots& slots, int64_t bytes, Exported* mine) {
  cudaError_t e = cudaMalloc(&slots.own_, bytes);
  if (e != cudaSuccess) {
    slots.own_ = nullptr;
    return c10::str("cudaMalloc(", bytes, " bytes): ", cudaText(e),
                    " (lower TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES)");
  }
  e = cudaIpcGetMemHandle(&mine->handle, slots.own_);
  if (e != cudaSuccess) return c10::str("cudaIpcGetMemHandle: ", cudaText(e));
  e = cudaDeviceGetPCIBusId(mine->pciBusId, sizeof(mine->pciBusId), slots.device().index());
  if (e != cudaSuccess) return c10::str("cudaDeviceGetPCIBusId: ", cudaText(e));
  return "";
}

// This rank's barrier flags (zeroed before any peer can map them) and the host-mapped word a
// barrier that gives up writes; "" on success.
std::string exportFlags(IpcSlots& slots, int localSize, Exported* mine) {
  const size_t bytes = sizeof(unsigned long long) * (localSize + 1);
  cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&slots.ownFlags_), bytes);
  if (e != cudaSuccess) {
    slots.ownFlags_ = nullptr;
    return c10::str("cudaMalloc of the barrier flags: ", cudaText(e));
  }
  if ((e = cudaMemset(slots.ownFlags_, 0, bytes)) != cudaSuccess ||
      (e = cudaDeviceSynchronize()) != cudaSuccess)
    return c10::str("zeroing the barrier flags: ", cudaText(e));
  // two host-mapped words: [0] the barrier that gave up, [1] abort()'s cancel
  e = cudaHostAlloc(reinterpret_cast<void**>(&slots.gaveUp_), 2 * sizeof(unsigned long long),
                    cudaHostAllocMapped);
  if (e != cudaSuccess) {
    slots.gaveUp_ = nullptr;
    return c10::str("cudaHostAlloc (mapped) of the barrier's timeout word: ", cudaText(e));
  }
  slots.gaveUp_[0] = slots.gaveUp_[1] = 0;
  e = cudaIpcGetMemHandle(&mine->flagsHandle, slots.ownFlags_);
  if (e != cudaSuccess) return c10::str("cudaIpcGetMemHandle of the barrier flags: ", cudaText(e));
  return "";
}

}  // namespace

std::string gpuIdentity(c10::DeviceIndex index) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), index) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the caller's next check
    return "";
  }
  return std::string(id, strnlen(id, sizeof(id)));
}

namespace {

// Who waits for the node's barriers: the host (its segment's barrier) or a kernel (device flags).
enum class Waits { Host, Kernel };

// How the node's ranks wait for each other, from what every local rank sent (the same answer on
// each); sets *how; returns why.
std::string chooseOrdering(node::Ordering asked, const std::vector<Exported>& all, Waits* how) {
  *how = Waits::Host;
  const int n = static_cast<int>(all.size());
  std::set<std::string> gpus;
  for (const auto& e : all) gpus.insert(std::string(e.pciBusId, strnlen(e.pciBusId, 32)));
  const bool shared = static_cast<int>(gpus.size()) < n;  // fewer GPUs than ranks
  if (asked == node::Ordering::Host)
    return "ordered from the host (TORCH_MPIGPU_NODE_DEVICE_ORDER=host)";
  if (n > kMaxBarrierRanks)
    return c10::str("ordered from the host: a device barrier serves at most ", kMaxBarrierRanks,
                    " ranks of a node, this one has ", n);
  for (int r = 0; r < n; ++r)
    if (!all[r].flagsOk)
      return c10::str("ordered from the host: local rank ", r, " could not make its barrier flags");
  if (asked == node::Ordering::Auto && shared)
    return "ordered from the host: ranks of the node share a GPU, where a kernel waiting for "
           "another process would hold it for a whole time slice "
           "(TORCH_MPIGPU_NODE_DEVICE_ORDER=device overrides)";
  *how = Waits::Kernel;
  return asked == node::Ordering::Device
             ? "ordered on the device by flags (TORCH_MPIGPU_NODE_DEVICE_ORDER=device)"
             : "ordered on the device by flags (every rank of the node has a GPU of its own)";
}

// Maps every peer's flags and fills the barrier's arguments; "" on success.
std::string mapFlags(IpcSlots& slots, const std::vector<Exported>& all, int localRank,
                     int64_t timeoutMs) {
  const int n = static_cast<int>(all.size());
  NodeBarrierArgs& a = slots.barrierArgs_;
  for (int r = 0; r < n; ++r) {
    if (r == localRank) {
      slots.peerFlags_[r] = slots.ownFlags_;
    } else {
      void* p = nullptr;
      const cudaError_t e =
          cudaIpcOpenMemHandle(&p, all[r].flagsHandle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess)
        return c10::str("cudaIpcOpenMemHandle of local rank ", r,
                        "'s barrier flags: ", cudaText(e));
      slots.peerFlags_[r] = p;
    }
    a.flags[r] = static_cast<unsigned long long*>(slots.peerFlags_[r]);
  }
  void* gaveUpOnDevice = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&gaveUpOnDevice, slots.gaveUp_, 0);
  if (e != cudaSuccess) return c10::str("cudaHostGetDevicePointer: ", cudaText(e));
  a.count = slots.ownFlags_ + n;
  a.gaveUp = static_cast<unsigned long long*>(gaveUpOnDevice);
  a.cancelled = a.gaveUp + 1;
  a.localRank = localRank;
  a.localSize = n;
  a.timeoutNs = static_cast<unsigned long long>(std::max<int64_t>(timeoutMs, 1000)) * 1000000ULL;
  return "";
}

// Maps local rank r's buffer; "" on success.
std::string mapPeer(IpcSlots& slots, int r, const Exported& theirs) {
  int theirDevice = -1, canAccess = 0;
  if (cudaDeviceGetByPCIBusId(&theirDevice, theirs.pciBusId) != cudaSuccess) {
    cudaGetLastError();
    return c10::str("local rank ", r, "'s GPU (", theirs.pciBusId,
                    ") is outside this process's view (CUDA_VISIBLE_DEVICES)");
  }
  const int mine = slots.device().index();
  if (theirDevice != mine &&
      (cudaDeviceCanAccessPeer(&canAccess, mine, theirDevice) != cudaSuccess || !canAccess)) {
    cudaGetLastError();
    return c10::str("no peer access from GPU ", mine, " to local rank ", r, "'s GPU ", theirDevice);
  }
  void* p = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, theirs.handle, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    return c10::str("cudaIpcOpenMemHandle of local rank ", r, "'s buffer: ", cudaText(e),
                    " (a container that blocks CUDA IPC?)");
  }
  slots.peers_[r] = p;
  return "";
}

}  // namespace

std::unique_ptr<node::DeviceSlots> makeIpcSlots(const mpi::Comm& nodeComm,
                                                const node::SlotsSpec& spec,
                                                const at::Device& device, const char* op, int rank,
                                                std::string* why) {
  c10::cuda::CUDAGuard guard(device);
  auto slots = std::make_unique<IpcSlots>(device, spec.slotBytes, nodeComm.rank, nodeComm.size);
  Exported mine{};
  std::string error = exportOwn(*slots, 2 * spec.slotBytes, &mine);
  mine.ok = error.empty() ? 1 : 0;
  // flags for device ordering: a rank that cannot make them has the node ordered from the host
  mine.flagsOk = spec.ordering != node::Ordering::Host && error.empty() &&
                         exportFlags(*slots, nodeComm.size, &mine).empty()
                     ? 1
                     : 0;
  std::vector<Exported> all(nodeComm.size);
  MPIGPU_MPI_CHECK(MPI_Allgather(&mine, sizeof(Exported), MPI_BYTE, all.data(), sizeof(Exported),
                                 MPI_BYTE, nodeComm.handle),
                   op, rank);
  slots->peers_[nodeComm.rank] = slots->own_;
  for (int r = 0; r < nodeComm.size && error.empty(); ++r) {
    if (r == nodeComm.rank) continue;
    error = all[r].ok ? mapPeer(*slots, r, all[r])
                      : c10::str("local rank ", r, " could not export its device buffer");
  }
  if (error.empty()) {
    Waits how = Waits::Host;
    slots->ordering_ = chooseOrdering(spec.ordering, all, &how);
    if (how != Waits::Host) error = mapFlags(*slots, all, nodeComm.rank, spec.barrierTimeoutMs);
    slots->onDevice_ = how != Waits::Host && error.empty();
  }
  if (!error.empty()) {
    *why = error;
    return nullptr;  // what was mapped is unmapped by the destructor
  }
  return slots;
}

}  // namespace mpigpu::cuda
