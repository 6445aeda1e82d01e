#include "ops/Fusion.hpp"

#include <limits>
#include <map>

namespace mpigpu {

std::vector<std::vector<size_t>> fusionBuckets(const std::vector<at::Tensor>& ts, int64_t limit,
                                               int64_t alone) {
  if (ts.size() == 1) return {{0}};  // the common case, without the bookkeeping below
  std::vector<at::ScalarType> order;
  std::map<at::ScalarType, std::vector<size_t>> byDtype;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto dt = ts[i].scalar_type();
    if (!byDtype.count(dt)) order.push_back(dt);
    byDtype[dt].push_back(i);
  }
  std::vector<std::vector<size_t>> buckets;
  for (auto dt : order) {
    std::vector<size_t> cur;
    int64_t bytes = 0;
    for (size_t i : byDtype[dt]) {
      const int64_t b = ts[i].numel() * static_cast<int64_t>(ts[i].element_size());
      if (b >= alone && b > 0) {
        buckets.push_back({i});
        continue;
      }
      if (!cur.empty() && bytes + b > limit) {
        buckets.push_back(std::move(cur));
        cur.clear();
        bytes = 0;
      }
      cur.push_back(i);
      bytes += b;
    }
    if (!cur.empty()) buckets.push_back(std::move(cur));
  }
  return buckets;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& ts, const std::vector<size_t>& idx) {
  std::vector<at::Tensor> out;
  out.reserve(idx.size());
  for (size_t i : idx) out.push_back(ts[i]);
  return out;
}

std::vector<at::Tensor> rankMajorRows(const std::vector<at::Tensor>& ts, int size) {
  std::vector<at::Tensor> rows;
  rows.reserve(ts.size() * size);
  for (int r = 0; r < size; ++r) {
    for (const auto& t : ts) rows.push_back(t.view({size, -1}).select(0, r));
  }
  return rows;
}

// On the host a big tensor is cheaper sent in place than copied into a bucket; on a device the
// pack is one fast kernel and saves MPI calls (and host<->device copies when staged). Decided by
// the group, not by this rank's tensors: in a group of CUDA and CPU ranks each must cut the same
// buckets, or their collectives would not match.
int64_t fuseBelow(const Config& config, bool groupHasGpu) {
  return groupHasGpu ? std::numeric_limits<int64_t>::max() : config.fuseBelowBytes;
}

}  // namespace mpigpu
