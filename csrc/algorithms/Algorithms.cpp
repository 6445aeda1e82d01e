#include "algorithms/Algorithms.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace mpigpu::algo {
namespace {
std::atomic<uint64_t> g_runs[4];
void counted(Algo a) { g_runs[static_cast<int>(a)].fetch_add(1, std::memory_order_relaxed); }
}  // namespace

uint64_t runCount(Algo a) { return g_runs[static_cast<int>(a)].load(std::memory_order_relaxed); }

const char* algoName(Algo a) {
  switch (a) {
    case Algo::Mpi: return "mpi";
    case Algo::Ring: return "ring";
    case Algo::Rhd: return "rhd";
    case Algo::Allgather: return "allgather";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Choice

Algo choose(const Config& config, OpKind kind, int64_t bytes, at::ScalarType dtype, int worldSize,
            bool groupHasGpu) {
  if (config.algo) {
    const Algo forced = *config.algo;
    // rhd and allgather are all_reduce algorithms; the others' blocks are the ring's
    if (kind != OpKind::Allreduce && (forced == Algo::Rhd || forced == Algo::Allgather)) {
      return Algo::Ring;
    }
    return forced;
  }
  if (!groupHasGpu) {
    // MPI reduces fp16/bf16 with a user-defined op one element at a time; Open MPI 5's
    // reduce_scatter lost to the ring from 1 MiB (see Config.hpp)
    const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
    if (worldSize > 1 && half && kind != OpKind::Reduce && bytes >= config.hostHalfRingBytes) {
      return Algo::Ring;
    }
    if (worldSize > 1 && kind == OpKind::ReduceScatter &&
        bytes >= config.hostReduceScatterRingBytes) {
      return Algo::Ring;
    }
    return Algo::Mpi;
  }
  // Below algoMinBytes MPI's own (staged for CUDA tensors) was faster on the GPU (Config.hpp).
  return bytes < config.algoMinBytes ? Algo::Mpi : Algo::Ring;
}

std::string describeChoice(const Config& config, bool groupHasGpu) {
  if (config.algo) {
    return c10::str("TORCH_MPIGPU_ALGO=", algoName(*config.algo),
                    " for every reduction (reduce_scatter and reduce: ring unless mpi)");
  }
  if (!groupHasGpu) {
    return c10::str(
        "auto, no member has a GPU: MPI's own collectives, except the ring for "
        "fp16/bf16 all_reduce and reduce_scatter from ",
        config.hostHalfRingBytes, " bytes and any reduce_scatter from ",
        config.hostReduceScatterRingBytes, " bytes");
  }
  return c10::str("auto, a member has a GPU: MPI's own below ", config.algoMinBytes,
                  " bytes, from there the ring, reduced on the device; messages of at most ",
                  config.algoPieceBytes, " bytes");
}

// ---------------------------------------------------------------------------------------------
// Algorithms

namespace {

// n elements cut into k blocks whose sizes differ by at most one.
struct Blocks {
  int64_t n;
  int k;
  int64_t offset(int b) const { return b * (n / k) + std::min<int64_t>(b, n % k); }
  int64_t length(int b) const { return offset(b + 1) - offset(b); }
};

int mod(int a, int p) { return ((a % p) + p) % p; }

// Calls f(offset, count) for consecutive pieces of [0, len): the same cut on every rank, so
// sender and receiver agree on each message.
template <typename F>
void forPieces(int64_t len, int64_t piece, F&& f) {
  for (int64_t off = 0; off < len; off += piece) f(off, std::min(piece, len - off));
}

double finalScale(const Context& c, int size) { return c.red.divideBySize ? 1.0 / size : 1.0; }

// PREMUL_SUM: every rank's input times its factor, before anything is summed. In place when the
// buffer is the op's own result; else a copy, so the caller's input is left as it was.
at::Tensor prescale(const Context& c, const at::Tensor& in, bool inPlace) {
  if (!c.red.needsPrescale()) return in;
  at::NoGradGuard noGrad;
  at::Tensor factor = c.red.premulTensor.defined()
                          ? c.red.premulTensor.to(in.device(), in.scalar_type())
                          : at::scalar_tensor(*c.red.premulScalar, in.options());
  if (inPlace) return in.mul_(factor);
  return in * factor;
}

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
  std::vector<size_t> receiving, sending;
  forPieces(range.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    receiving.push_back(c.link.irecv(tmp.narrow(0, off, m), peer));
  });
  forPieces(sendRange.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    sending.push_back(c.link.isend(sendRange.narrow(0, off, m), peer));
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
  std::vector<size_t> h;
  forPieces(theirs.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    h.push_back(c.link.irecv(theirs.narrow(0, off, m), partner));
  });
  forPieces(mine.numel(), c.pieceElems, [&](int64_t off, int64_t m) {
    h.push_back(c.link.isend(mine.narrow(0, off, m), partner));
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

}  // namespace

void allreduce(Context& c, Algo algo, const at::Tensor& buf) {
  counted(algo);
  if (buf.numel() == 0) return;
  prescale(c, buf, /*inPlace=*/true);
  switch (algo) {
    case Algo::Ring: {
      const int p = c.link.comm().size, r = c.link.comm().rank;
      const Blocks blk{buf.numel(), p};
      ringReduceScatter(c, buf, buf.narrow(0, blk.offset(r), blk.length(r)), /*inPlace=*/true);
      ringAllgather(c, buf);
      break;
    }
    case Algo::Rhd: rhdAllreduce(c, buf); break;
    case Algo::Allgather: allgatherAllreduce(c, buf); break;
    case Algo::Mpi: TORCH_INTERNAL_ASSERT(false, "mpigpu: algo::allreduce called for mpi");
  }
  c.link.settle();
}

void reduceScatter(Context& c, const at::Tensor& in, const at::Tensor& out) {
  counted(Algo::Ring);
  if (out.numel() == 0) return;
  ringReduceScatter(c, prescale(c, in, /*inPlace=*/false), out, /*inPlace=*/false);
  c.link.settle();
}

void reduce(Context& c, const at::Tensor& buf, int root) {
  counted(Algo::Ring);
  if (buf.numel() == 0) return;
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
}

}  // namespace mpigpu::algo
