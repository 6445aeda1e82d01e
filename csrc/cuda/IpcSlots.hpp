// The node algorithm's device slots on CUDA (node/DeviceSlots.hpp): each rank cudaMallocs its two
// halves once, exports them with cudaIpcGetMemHandle, and maps every peer's over the node
// communicator, so a rank's kernels read its peers' slots directly (same GPU, or GPUs with peer
// access). Compiled only in builds with CUDA sources.
#pragma once

#include "node/DeviceSlots.hpp"

namespace mpigpu::cuda {

// A node::DeviceSlotsMaker: collective over `nodeComm`; null with the reason in `why` where this
// rank could not allocate, export or map (no peer access, a container that blocks CUDA IPC, a
// peer's GPU outside this process's view).
// `device`: the GPU whose memory holds this rank's slots. With device ordering (spec.ordering,
// cuda/NodeBarrier.hpp) each rank also exports barrier flags.
std::unique_ptr<node::DeviceSlots> makeIpcSlots(const mpi::Comm& nodeComm,
                                                const node::SlotsSpec& spec,
                                                const at::Device& device, const char* op, int rank,
                                                std::string* why);

// The GPU `index` as every process on the node names it (its PCI bus id); "" where CUDA cannot
// say. Ranks with the same id share one GPU.
std::string gpuIdentity(c10::DeviceIndex index);

}  // namespace mpigpu::cuda
