#include <algorithm>

#include "ops/ArgChecks.hpp"
#include "core/Errors.hpp"
#include "ops/Fusion.hpp"
#include "mpi/Types.hpp"
#include "ops/OpPlan.hpp"

namespace mpigpu::ops {

using paths::Access;
using paths::OpBuffers;

algo::Facts Group::facts(algo::OpKind kind, const std::vector<at::Tensor>& tensors) const {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  const bool nodeSuits = node && node->suits();
  const bool onSharedDevice = nodeSuits && node->leaderOnSharedDevice() && !tensors[0].is_cpu();
  return {kind,      bytes,      tensors[0].scalar_type(), size,        hasGpu,
          nodeSuits, spansNodes, onSharedDevice,           comm.crowded};
}

const algo::Algorithm* Group::choose(algo::OpKind kind,
                                     const std::vector<at::Tensor>& tensors) const {
  return algo::choose(policy, config, facts(kind, tensors));
}

bool Group::onDeviceSlots(const algo::Algorithm* a) const {
  return a == &algo::node() && node && node->onDevice();
}

std::vector<std::vector<size_t>> Group::buckets(const std::vector<at::Tensor>& tensors) const {
  return fusionBuckets(tensors, config.fusionBytes, fuseBelow(config, hasGpu));
}

void Group::withAlgorithm(const OpBuffers& bufs, const char* op, const at::Tensor& buf,
                          const mpi::Reduction& red,
                          const std::function<void(algo::Context&)>& fn) const {
  auto link = bufs.link(algoComm, op, buf.numel() * static_cast<int64_t>(buf.element_size()));
  auto reducer = bufs.reducer(red.kind);
  const int64_t piece = std::clamp<int64_t>(
      config.algoPieceBytes / static_cast<int64_t>(buf.element_size()), 1, algoComm.maxCount);
  algo::Context ctx{*link, *reducer, red, piece, node.get()};
  fn(ctx);
}

void Group::gatherAll(const OpBuffers& bufs, const char* op, const algo::Algorithm* mover,
                      const at::Tensor& in, at::Tensor& out) const {
  bool moved = false;
  if (mover != nullptr) {
    withAlgorithm(bufs, op, in, mpi::Reduction{},
                  [&](algo::Context& c) { moved = algo::allgather(c, *mover, in, out); });
  }
  if (!moved) mpi::allgather(comm, op, in, out);
}

void Group::broadcastFrom(const OpBuffers& bufs, const char* op, const algo::Algorithm* mover,
                          at::Tensor& buf, int root) const {
  bool moved = false;
  if (mover != nullptr) {
    withAlgorithm(bufs, op, buf, mpi::Reduction{},
                  [&](algo::Context& c) { moved = algo::broadcast(c, *mover, buf, root); });
  }
  if (!moved) mpi::broadcast(comm, op, buf, root);
}

void checkNarrowWide(const Group& g, const char* op, const std::vector<at::Tensor>& narrow,
                     const char* narrowName, const std::vector<at::Tensor>& wide,
                     const char* wideName) {
  MPIGPU_CHECK_VALUE(narrow.size() == wide.size() && !narrow.empty(), op, g.rank, "needs as many ",
                     wideName, "s as ", narrowName, "s (and at least one), got ", wide.size(), " ",
                     wideName, "s and ", narrow.size(), " ", narrowName, "s");
  const std::string anotherNarrow = std::string("an ") + narrowName;
  const std::string theWide = std::string("the ") + wideName;
  for (size_t i = 0; i < narrow.size(); ++i) {
    checkSameDevice(op, g.rank, narrow[0], narrow[i], anotherNarrow.c_str());
    checkSameKind(op, g.rank, narrow[i], wide[i], theWide.c_str());
    MPIGPU_CHECK_VALUE(wide[i].numel() == narrow[i].numel() * g.size, op, g.rank, wideName,
                       " must have group size (", g.size, ") x ", narrowName, " elements (",
                       narrow[i].numel(), "), got ", wide[i].numel());
  }
}

std::vector<PackedBucket> packBuckets(const Group& g, OpBuffers& bufs,
                                      const std::vector<at::Tensor>& narrow, Access narrowAccess,
                                      const std::vector<at::Tensor>& wide, Access wideAccess) {
  std::vector<PackedBucket> packed;
  const bool written = wideAccess != Access::Read;
  auto add = [&](const std::vector<size_t>& idx) {
    std::vector<at::Tensor> wides;
    if (idx.size() > 1) {
      std::vector<at::Tensor> shaped;  // read-only: a copy where not contiguous is fine
      for (size_t i : idx) shaped.push_back(written ? wide[i] : wide[i].reshape({g.size, -1}));
      wides = rankMajorRows(shaped, g.size);
    } else {
      wides = pick(wide, idx);  // one tensor is rank-major already: MPI reads it as it is
    }
    // what is read first, as the other ops add theirs
    if (narrowAccess == Access::Read) {
      const size_t n = bufs.add(pick(narrow, idx), narrowAccess);
      packed.push_back({n, bufs.add(wides, wideAccess), idx[0]});
    } else {
      const size_t w = bufs.add(wides, wideAccess);
      packed.push_back({bufs.add(pick(narrow, idx), narrowAccess), w, idx[0]});
    }
  };
  for (const auto& idx : g.buckets(narrow)) {
    std::vector<size_t> fused;
    for (size_t i : idx) {
      if (!written || wide[i].is_contiguous())
        fused.push_back(i);
      else
        add({i});
    }
    if (!fused.empty()) add(fused);
  }
  return packed;
}

}  // namespace mpigpu::ops
