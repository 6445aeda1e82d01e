// The CUDA data paths (compiled only when the extension is built with CUDA): cuda-direct hands
// device pointers to a CUDA-aware MPI, cuda-staged goes through pinned host memory. Both run
// their copies on a comm stream per group and device, ordered after the caller's stream.
#pragma once

#include <memory>

#include "paths/OpBuffers.hpp"

namespace mpigpu::cuda {

// Per process group: its comm stream on each device.
struct GroupStreams;
std::shared_ptr<GroupStreams> createGroupState();

std::shared_ptr<paths::OpBuffers> createOpBuffers(paths::PathKind kind, const at::Device& device,
                                                  const std::shared_ptr<GroupStreams>& groupState,
                                                  int64_t stagingChunkBytes);

}  // namespace mpigpu::cuda
