#include "cuda/IpcSlots.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/StringUtil.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "algorithms/Reducer.hpp"
#include "cuda/ReduceKernels.hpp"
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
      : peers_(localSize, nullptr), device_(device), slotBytes_(slotBytes), localRank_(localRank) {}
  ~IpcSlots() override {
    c10::cuda::CUDAGuard guard(device_);
    for (size_t r = 0; r < peers_.size(); ++r)
      if (static_cast<int>(r) != localRank_ && peers_[r] != nullptr)
        cudaIpcCloseMemHandle(peers_[r]);
    if (own_ != nullptr) cudaFree(own_);
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

  // this rank's allocation: both halves
  void* own_ = nullptr;
  // every local rank's allocation as mapped here (own_ at localRank_)
  std::vector<void*> peers_;

 private:
  const at::Device device_;
  const int64_t slotBytes_;
  const int localRank_;
  int half_ = 0;
};

// What each rank sends its node: its buffer's handle and where that buffer lives.
struct Exported {
  cudaIpcMemHandle_t handle;
  char pciBusId[32];
  int ok;
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

std::unique_ptr<node::DeviceSlots> makeIpcSlots(const mpi::Comm& nodeComm, int64_t slotBytes,
                                                const at::Device& device, const char* op, int rank,
                                                std::string* why) {
  c10::cuda::CUDAGuard guard(device);
  auto slots = std::make_unique<IpcSlots>(device, slotBytes, nodeComm.rank, nodeComm.size);
  Exported mine{};
  std::string error = exportOwn(*slots, 2 * slotBytes, &mine);
  mine.ok = error.empty() ? 1 : 0;
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
  if (!error.empty()) {
    *why = error;
    return nullptr;  // what was mapped is unmapped by the destructor
  }
  return slots;
}

}  // namespace mpigpu::cuda
