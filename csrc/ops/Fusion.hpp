// Fusion: many tensors of one dtype travel back to back in one MPI call, up to
// TORCH_MPIGPU_FUSION_BYTES. The policy (which tensors share a bucket) lives here; the reused host
// buffer they are packed into is the path factory's HostScratch (paths/OpBuffers.hpp).
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/Config.hpp"

namespace mpigpu {

// Indices of `ts` grouped by dtype (first-seen order), each group cut into runs of at most
// `limit` bytes. A tensor larger than that, or of at least `alone` bytes, travels alone.
std::vector<std::vector<size_t>> fusionBuckets(const std::vector<at::Tensor>& ts, int64_t limit,
                                               int64_t alone);
// The tensors of `ts` at `idx`, in that order.
std::vector<at::Tensor> pick(const std::vector<at::Tensor>& ts, const std::vector<size_t>& idx);
// Rank-major row views: row r of every tensor (seen as [size, n]), for r = 0..size-1. An allgather
// of packed inputs lands in exactly this order, and a reduce-scatter reads it.
std::vector<at::Tensor> rankMajorRows(const std::vector<at::Tensor>& ts, int size);
// Tensors of at least this many bytes are not packed. Every rank must cut the same buckets (each
// is one collective), so this depends on what the group agreed, never on a rank's own device: a
// group with a GPU packs everything (one fast kernel on a device), a host-only group leaves big
// tensors in place (cheaper than the copy).
int64_t fuseBelow(const Config& config, bool groupHasGpu);

}  // namespace mpigpu
