#include "algorithms/Algorithms.hpp"

#include "algorithms/NodeAlgorithms.hpp"
#include "algorithms/Steps.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/Overlap.hpp"

namespace mpigpu::algo {
// ---------------------------------------------------------------------------------------------
// Algorithms

namespace {

// Ring reduce-scatter over size blocks of `in`; rank r ends with block r reduced in `out`.
// inPlace: partial sums are kept in `in` itself and `out` is in's block r (all_reduce); else
// `in` is only read and partial sums go to two scratch blocks.
void ringReduceScatter(Context& c, const at::Tensor& in, const at::Tensor& out, bool inPlace) {
  Link& link = c.link;
  const int p = link.comm().size, r = link.comm().rank;
  if (p == 1) {
    if (!inPlace) out.copy_(in);
    return;
  }
  const Blocks blk{in.numel(), p};
  const int right = mod(r + 1, p), left = mod(r - 1, p);
  const int64_t widest = blk.length(0);
  at::Tensor recvTmp[2] = {at::empty({widest}, in.options()), at::empty({widest}, in.options())};
  at::Tensor partial[2];
  if (!inPlace)
    partial[0] = at::empty({widest}, in.options()), partial[1] = at::empty({widest}, in.options());

  // Step s sends block r-s-1 and receives block r-s-2 from the left, which it reduces with its
  // own contribution; what it reduced is what it sends in step s+1, so each piece is forwarded
  // as soon as it is reduced. After size-1 steps block r is complete here.
  std::vector<size_t> sending, nextSending, receiving;
  {
    const int b = mod(r - 1, p);
    forPieces(blk.length(b), c.pieceElems, [&](int64_t off, int64_t m) {
      sending.push_back(link.isend(in.narrow(0, blk.offset(b) + off, m), right));
    });
  }
  for (int s = 0; s < p - 1; ++s) {
    const int b = mod(r - s - 2, p);
    const bool last = s == p - 2;
    const at::Tensor& tmp = recvTmp[s % 2];
    forPieces(blk.length(b), c.pieceElems, [&](int64_t off, int64_t m) {
      receiving.push_back(link.irecv(tmp.narrow(0, off, m), left));
    });
    size_t i = 0;
    forPieces(blk.length(b), c.pieceElems, [&](int64_t off, int64_t m) {
      link.wait(receiving[i++]);
      at::Tensor mine = in.narrow(0, blk.offset(b) + off, m);
      at::Tensor dst =
          last ? out.narrow(0, off, m) : (inPlace ? mine : partial[s % 2].narrow(0, off, m));
      c.reducer.combine(dst, mine, tmp.narrow(0, off, m), last ? finalScale(c, p) : 1.0);
      if (!last) nextSending.push_back(link.isend(dst, right));
    });
    receiving.clear();
    // This step's sends are done before step s+2 rewrites the scratch they read.
    link.waitAll(sending);
    std::swap(sending, nextSending);
  }
  link.waitAll(sending);
}

// Ring all-gather in place: rank r holds block r of `buf`; afterwards every block.
void ringAllgather(Context& c, const at::Tensor& buf) {
  Link& link = c.link;
  const int p = link.comm().size, r = link.comm().rank;
  if (p == 1) return;
  const Blocks blk{buf.numel(), p};
  const int right = mod(r + 1, p), left = mod(r - 1, p);
  std::vector<size_t> sending, nextSending, receiving;
  forPieces(blk.length(r), c.pieceElems, [&](int64_t off, int64_t m) {
    sending.push_back(link.isend(buf.narrow(0, blk.offset(r) + off, m), right));
  });
  for (int s = 0; s < p - 1; ++s) {
    const int b = mod(r - s - 1, p);
    const bool last = s == p - 2;
    forPieces(blk.length(b), c.pieceElems, [&](int64_t off, int64_t m) {
      receiving.push_back(link.irecv(buf.narrow(0, blk.offset(b) + off, m), left));
    });
    size_t i = 0;
    forPieces(blk.length(b), c.pieceElems, [&](int64_t off, int64_t m) {
      link.wait(receiving[i++]);
      if (!last) nextSending.push_back(link.isend(buf.narrow(0, blk.offset(b) + off, m), right));
    });
    receiving.clear();
    link.waitAll(sending);
    std::swap(sending, nextSending);
  }
  link.waitAll(sending);
}

// Sends all of `t` to `peer` in pieces / receives all of it.
void sendWhole(Context& c, const at::Tensor& t, int peer) {
  std::vector<size_t> h;
  forPieces(t.numel(), c.pieceElems,
            [&](int64_t off, int64_t m) { h.push_back(c.link.isend(t.narrow(0, off, m), peer)); });
  c.link.waitAll(h);
}

void recvWhole(Context& c, const at::Tensor& t, int peer) {
  std::vector<size_t> h;
  forPieces(t.numel(), c.pieceElems,
            [&](int64_t off, int64_t m) { h.push_back(c.link.irecv(t.narrow(0, off, m), peer)); });
  c.link.waitAll(h);
}

// Receives `peer`'s copy of `range` into tmp and reduces it into `range`, piece by piece
// (while `sendRange` goes to the peer).
void exchangeReduce(Context& c, const at::Tensor& sendRange, const at::Tensor& range,
                    const at::Tensor& tmp, int peer, double scale) {
  c.link.settle();  // earlier steps' kernels may still read tmp
  // Sends before receives: posted the other way round, Open MPI 5 over TCP ran such an exchange
  // at half the link's speed (Config.hpp: hostAcrossRingBytes).
  std::vector<size_t> receiving, sending;
  forPieces(sendRange.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    sending.push_back(c.link.isend(sendRange.narrow(0, off, m), peer));
  });
  forPieces(range.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    receiving.push_back(c.link.irecv(tmp.narrow(0, off, m), peer));
  });
  size_t i = 0;
  forPieces(range.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    c.link.wait(receiving[i++]);
    at::Tensor mine = range.narrow(0, off, m);
    c.reducer.combine(mine, mine, tmp.narrow(0, off, m), scale);
  });
  c.link.waitAll(sending);
}

// Sends `mine` to `partner` and receives its range into `theirs`, piece by piece.
void swapRanges(Context& c, const at::Tensor& mine, const at::Tensor& theirs, int partner) {
  c.link.settle();
  std::vector<size_t> h;  // sends first, as in exchangeReduce
  forPieces(mine.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    h.push_back(c.link.isend(mine.narrow(0, off, m), partner));
  });
  forPieces(theirs.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    h.push_back(c.link.irecv(theirs.narrow(0, off, m), partner));
  });
  c.link.waitAll(h);
}

void rhdAllreduce(Context& c, const at::Tensor& buf) {
  Link& link = c.link;
  const int p = link.comm().size, r = link.comm().rank;
  if (p == 1) return;
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  const int extra = p - pow2;
  const int64_t n = buf.numel();
  at::Tensor tmp = at::empty({n}, buf.options());  // the fold's whole buffer or a kept range
  // Fold: of ranks 0..2*extra-1, each even rank hands its data to the odd one above it and sits
  // out; the others are renumbered 0..pow2-1.
  int me;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      sendWhole(c, buf, r + 1);
      recvWhole(c, buf, r + 1);
      return;
    }
    recvWhole(c, tmp.narrow(0, 0, n), r - 1);
    c.reducer.combine(buf, buf, tmp.narrow(0, 0, n), 1.0);
    me = r / 2;
  } else {
    me = r - extra;
  }
  auto realRank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  const Blocks blk{n, pow2};
  auto span = [&](int lo, int hi) {
    return buf.narrow(0, blk.offset(lo), blk.offset(hi) - blk.offset(lo));
  };
  // Recursive halving: keep the half of the current range that holds my block, send the other
  // half to the partner, reduce the partner's copy of mine.
  int lo = 0, hi = pow2;
  for (int mask = pow2 / 2; mask >= 1; mask /= 2) {
    const int partner = realRank(me ^ mask);
    const int mid = lo + (hi - lo) / 2;
    const bool lower = (me & mask) == 0;
    const int keepLo = lower ? lo : mid, keepHi = lower ? mid : hi;
    exchangeReduce(c, lower ? span(mid, hi) : span(lo, mid), span(keepLo, keepHi), tmp, partner,
                   mask == 1 ? finalScale(c, p) : 1.0);
    lo = keepLo;
    hi = keepHi;
  }
  // Recursive doubling: swap finished ranges with partners until every rank has all of them.
  for (int mask = 1; mask < pow2; mask *= 2) {
    const int partner = realRank(me ^ mask);
    const int width = hi - lo;
    const bool lower = (me & mask) == 0;
    const int theirLo = lower ? hi : lo - width;
    swapRanges(c, span(lo, hi), span(theirLo, theirLo + width), partner);
    lo = std::min(lo, theirLo);
    hi = lo + 2 * width;
  }
  // Unfold: the ranks that sat out get the result.
  if (r < 2 * extra) sendWhole(c, buf, r - 1);
}

void allgatherAllreduce(Context& c, const at::Tensor& buf) {
  const int p = c.link.comm().size;
  if (p == 1) return;
  const int64_t n = buf.numel();
  if (n == 0) return;
  at::Tensor rows = at::empty({p * n}, buf.options());
  c.link.allgather(buf, rows);
  rows = rows.view({p, n});
  // Rank order on every rank: every rank computes the same bits.
  c.reducer.combine(buf, rows[0], rows[1], p == 2 ? finalScale(c, p) : 1.0);
  for (int k = 2; k < p; ++k)
    c.reducer.combine(buf, buf, rows[k], k == p - 1 ? finalScale(c, p) : 1.0);
}

bool ringAllreduce(Context& c, const at::Tensor& buf) {
  prescale(c, buf, /*inPlace=*/true);
  const int p = c.link.comm().size, r = c.link.comm().rank;
  const Blocks blk{buf.numel(), p};
  ringReduceScatter(c, buf, buf.narrow(0, blk.offset(r), blk.length(r)), /*inPlace=*/true);
  ringAllgather(c, buf);
  c.link.settle();
  return true;
}

bool rhdAllreduceOp(Context& c, const at::Tensor& buf) {
  prescale(c, buf, /*inPlace=*/true);
  rhdAllreduce(c, buf);
  c.link.settle();
  return true;
}

bool allgatherAllreduceOp(Context& c, const at::Tensor& buf) {
  prescale(c, buf, /*inPlace=*/true);
  allgatherAllreduce(c, buf);
  c.link.settle();
  return true;
}

bool ringReduceScatterOp(Context& c, const at::Tensor& in, const at::Tensor& out) {
  ringReduceScatter(c, prescale(c, in, /*inPlace=*/false), out, /*inPlace=*/false);
  c.link.settle();
  return true;
}

bool ringReduce(Context& c, const at::Tensor& buf, int root) {
  const int p = c.link.comm().size, r = c.link.comm().rank;
  const Blocks blk{buf.numel(), p};
  if (r == root) {
    at::Tensor work = prescale(c, buf, /*inPlace=*/true);
    ringReduceScatter(c, work, work.narrow(0, blk.offset(r), blk.length(r)), /*inPlace=*/true);
    c.link.settle();
    std::vector<size_t> h;
    for (int q = 0; q < p; ++q) {
      if (q == r) continue;
      forPieces(blk.length(q), c.pieceElems, [&](int64_t off, int64_t m) {
        h.push_back(c.link.irecv(work.narrow(0, blk.offset(q) + off, m), q));
      });
    }
    c.link.waitAll(h);
  } else {
    at::Tensor mine = at::empty({blk.length(r)}, buf.options());
    ringReduceScatter(c, prescale(c, buf, /*inPlace=*/false), mine, /*inPlace=*/false);
    sendWhole(c, mine, root);
  }
  c.link.settle();
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The table

namespace {

bool isHalf(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// When auto takes the node algorithm, and why (docs/performance.md has the measurements; the
// settings' rows say which set each threshold):
// - Groups without a GPU, inside one node: at every size, but fp32/fp64/integer all_reduce from
//   NODE_HOST_MPI_FROM_BYTES (16 KiB) to below NODE_HOST_MPI_BELOW_BYTES (4 MiB), where Open
//   MPI's own shared-memory all_reduce (single copy between two processes) was faster: the node
//   algorithm's copy into the slots and its barriers cost more than they save there. Smaller ops
//   meet in one barrier; larger ones gain from every rank reducing its share at once; fp16/bf16,
//   which MPI reduces one element at a time, stay ours.
// - Across nodes (hierarchical, also where nodes hold different numbers of ranks): from
//   NODE_ACROSS_MIN_BYTES. Below it the shared-memory barriers on each side cost more than MPI's
//   own saves; above it one crossing of the link per lane wins.
// - Groups with a GPU: only device tensors whose node's ranks share a GPU, in the leader form
//   (Node::leaderOnSharedDevice), which gives each peer one turn of device work per op.
//   all_gather at any size (MPI's own all_gather of device memory is slow at every size),
//   all_reduce from NODE_SHARED_GPU_ALLREDUCE_BYTES, reduce_scatter from ALGO_MIN_BYTES (below,
//   MPI's own is one IPC copy). broadcast and reduce stay MPI's own. With a GPU per rank the
//   node algorithm is never auto's choice: no GPU run has measured it against NCCL-class nodes.
bool nodePicks(const Config& config, const Facts& f) {
  if (!f.nodeSuits || f.worldSize == 1 || config.nodeBufferBytes == 0) return false;
  if (f.groupHasGpu) {
    if (!f.onSharedDevice || f.spansNodes) return false;
    if (f.kind == OpKind::Allgather) return true;
    if (f.kind == OpKind::Allreduce) return f.bytes >= config.nodeSharedGpuAllreduceBytes;
    return f.kind == OpKind::ReduceScatter && f.bytes >= config.algoMinBytes;
  }
  if (f.spansNodes) return f.bytes >= config.nodeAcrossMinBytes;
  const int64_t from = f.crowded ? config.nodeHostMpiCrowdedFromBytes : config.nodeHostMpiFromBytes;
  const int64_t below =
      f.crowded ? config.nodeHostMpiCrowdedBelowBytes : config.nodeHostMpiBelowBytes;
  return f.kind != OpKind::Allreduce || isHalf(f.dtype) || f.bytes < from || f.bytes >= below;
}
std::string nodeRule(const Config& config, bool groupHasGpu) {
  if (config.nodeBufferBytes == 0) return "";
  if (groupHasGpu) {
    return c10::str(
        "node, leader form, for GPU tensors where the ranks of one node share a GPU: all_gather at "
        "any size, all_reduce from ",
        config.nodeSharedGpuAllreduceBytes, " bytes, reduce_scatter from ", config.algoMinBytes,
        " bytes");
  }
  return c10::str(
      "node (reductions, all_gather, broadcast) where more than one rank shares a node: inside "
      "one node at any size (fp32/fp64/integer all_reduce: below ",
      config.nodeHostMpiFromBytes, " and from ", config.nodeHostMpiBelowBytes,
      " bytes; on crowded hosts below ", config.nodeHostMpiCrowdedFromBytes, " and from ",
      config.nodeHostMpiCrowdedBelowBytes, "), from ", config.nodeAcrossMinBytes,
      " bytes across nodes");
}

bool ringPicks(const Config& config, const Facts& f) {
  if (f.worldSize == 1) return false;
  // Below algoMinBytes MPI's own (staged for CUDA tensors) was faster on the GPU (Config.hpp).
  if (f.groupHasGpu) return f.bytes >= config.algoMinBytes;
  // MPI reduces fp16/bf16 with a user-defined op one element at a time; Open MPI 5's
  // reduce_scatter lost to the ring from 1 MiB (see Config.hpp)
  if (isHalf(f.dtype) && f.kind != OpKind::Reduce && f.bytes >= config.hostHalfRingBytes)
    return true;
  // across nodes Open MPI's own all_reduce ran at half the link's speed (see Config.hpp)
  if (f.kind == OpKind::Allreduce && f.spansNodes && f.bytes >= config.hostAcrossRingBytes)
    return true;
  return f.kind == OpKind::ReduceScatter && f.bytes >= config.hostReduceScatterRingBytes;
}
std::string ringRule(const Config& config, bool groupHasGpu) {
  if (groupHasGpu) {
    return c10::str("ring from ", config.algoMinBytes,
                    " bytes, reduced on the device; messages of "
                    "at most ",
                    config.algoPieceBytes, " bytes");
  }
  return c10::str("ring for fp16/bf16 all_reduce and reduce_scatter from ",
                  config.hostHalfRingBytes, " bytes, any reduce_scatter from ",
                  config.hostReduceScatterRingBytes,
                  " bytes and, in groups that span nodes, any all_reduce from ",
                  config.hostAcrossRingBytes, " bytes");
}

bool never(const Config&, const Facts&) { return false; }
std::string neverRule(const Config&, bool) { return ""; }

const Algorithm kNode{"node",
                      "shared memory inside a node (one-shot / two-shot), hierarchical across "
                      "nodes",
                      &nodeAllreduce,
                      &nodeReduceScatter,
                      &nodeReduce,
                      &nodeAllgather,
                      &nodeBroadcast,
                      &nodePicks,
                      &nodeRule};
const Algorithm kRing{
    "ring",         "reduce-scatter + all-gather around the ring over point-to-point",
    &ringAllreduce, &ringReduceScatterOp,
    &ringReduce,    nullptr,
    nullptr,        &ringPicks,
    &ringRule};
const Algorithm kRhd{
    "rhd",           "recursive halving + doubling over point-to-point (all_reduce)",
    &rhdAllreduceOp, nullptr,
    nullptr,         nullptr,
    nullptr,         &never,
    &neverRule};
const Algorithm kAllgather{"allgather",
                           "one MPI_Allgather, then every rank reduces all inputs (all_reduce)",
                           &allgatherAllreduceOp,
                           nullptr,
                           nullptr,
                           nullptr,
                           nullptr,
                           &never,
                           &neverRule};

// The order auto asks the rows in.
const std::vector<const Algorithm*> kTable{&kNode, &kRing, &kRhd, &kAllgather};

// one counter per row (value-initialised: zero)
std::atomic<uint64_t>* const g_runs = new std::atomic<uint64_t>[kTable.size()]();

size_t indexOf(const Algorithm& a) {
  for (size_t i = 0; i < kTable.size(); ++i)
    if (kTable[i] == &a) return i;
  TORCH_INTERNAL_ASSERT(false, "mpigpu: an algorithm outside the table");
}
void counted(const Algorithm& a) { g_runs[indexOf(a)].fetch_add(1, std::memory_order_relaxed); }

}  // namespace

const std::vector<const Algorithm*>& algorithms() { return kTable; }
const Algorithm& ring() { return kRing; }
const Algorithm& node() { return kNode; }
uint64_t runCount(const Algorithm& a) { return g_runs[indexOf(a)].load(std::memory_order_relaxed); }

Policy policyFor(const std::string& word) {
  if (word == "auto") return {};
  if (word == "mpi") return {true, nullptr};
  std::string words = "auto, mpi";
  for (const Algorithm* a : kTable) {
    if (word == a->name) return {true, a};
    words += c10::str(", ", a->name);
  }
  C10_THROW_ERROR(ValueError,
                  c10::str("mpigpu: TORCH_MPIGPU_ALGO=", word, " must be one of: ", words));
}

namespace {
bool serves(const Algorithm& a, OpKind kind) {
  switch (kind) {
    case OpKind::Allreduce: return a.allreduce != nullptr;
    case OpKind::ReduceScatter: return a.reduceScatter != nullptr;
    case OpKind::Reduce: return a.reduce != nullptr;
    case OpKind::Allgather: return a.allgather != nullptr;
    case OpKind::Broadcast: return a.broadcast != nullptr;
  }
  return false;
}
}  // namespace

const Algorithm* choose(const Policy& policy, const Config& config, const Facts& facts) {
  if (policy.forced) {
    const Algorithm* a = policy.algorithm;
    return a != nullptr && (isReduction(facts.kind) || serves(*a, facts.kind)) ? a : nullptr;
  }
  for (const Algorithm* a : kTable)
    if (serves(*a, facts.kind) && a->autoPicks(config, facts)) return a;
  return nullptr;
}

const Algorithm& chooseOurs(const Policy& policy, const Config& config, const Facts& facts) {
  const Algorithm* a = choose(policy, config, facts);
  return a != nullptr ? *a : kRing;
}

std::string describeChoice(const Policy& policy, const Config& config, bool groupHasGpu) {
  if (policy.forced) {
    if (policy.algorithm == nullptr) return "TORCH_MPIGPU_ALGO=mpi: MPI's own for every op";
    return c10::str("TORCH_MPIGPU_ALGO=", policy.algorithm->name,
                    " for every op it serves (the ring for the other reductions, MPI's own for "
                    "the other ops)");
  }
  std::string rules;
  for (const Algorithm* a : kTable) {
    const std::string rule = a->autoRule(config, groupHasGpu);
    if (!rule.empty()) rules += rule + "; ";
  }
  return c10::str("auto, ", groupHasGpu ? "a member has a GPU: " : "no member has a GPU: ", rules,
                  "MPI's own otherwise");
}

void allreduce(Context& c, const Algorithm& a, const at::Tensor& buf) {
  const Algorithm& run = a.allreduce != nullptr ? a : kRing;
  if (buf.numel() == 0 || run.allreduce(c, buf)) return counted(run);
  counted(kRing);
  kRing.allreduce(c, buf);
}

void reduceScatter(Context& c, const Algorithm& a, const at::Tensor& in, const at::Tensor& out) {
  // An output inside the input elsewhere than at this rank's own block: the algorithms still send
  // blocks of `in` while they write `out` (the ring's first send at 2 ranks is that very block).
  // Its own block is safe: no algorithm sends it from `in`, and it is reduced element by element.
  const auto* ownBlock =
      static_cast<const char*>(in.const_data_ptr()) + c.link.comm().rank * out.nbytes();
  if (overlaps(in, out) && out.const_data_ptr() != ownBlock) {
    const at::Tensor fresh = at::empty_like(out);
    reduceScatter(c, a, in, fresh);
    out.copy_(fresh);
    return;
  }
  const Algorithm& run = a.reduceScatter != nullptr ? a : kRing;
  if (out.numel() == 0 || run.reduceScatter(c, in, out)) return counted(run);
  counted(kRing);
  kRing.reduceScatter(c, in, out);
}

void reduce(Context& c, const Algorithm& a, const at::Tensor& buf, int root) {
  const Algorithm& run = a.reduce != nullptr ? a : kRing;
  if (buf.numel() == 0 || run.reduce(c, buf, root)) return counted(run);
  counted(kRing);
  kRing.reduce(c, buf, root);
}

bool allgather(Context& c, const Algorithm& a, const at::Tensor& in, const at::Tensor& out) {
  if (a.allgather == nullptr || !(in.numel() == 0 || a.allgather(c, in, out))) return false;
  counted(a);
  return true;
}

bool broadcast(Context& c, const Algorithm& a, const at::Tensor& buf, int root) {
  if (a.broadcast == nullptr || !(buf.numel() == 0 || a.broadcast(c, buf, root))) return false;
  counted(a);
  return true;
}

}  // namespace mpigpu::algo
