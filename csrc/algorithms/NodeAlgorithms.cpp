#include "algorithms/NodeAlgorithms.hpp"

#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/Errors.hpp"
#include "core/Overlap.hpp"
#include "algorithms/Steps.hpp"
#include "mpi/Collectives.hpp"
#include "node/Node.hpp"

namespace mpigpu::algo {
namespace {

using node::Node;
using node::SharedSegment;
using node::Topology;

std::atomic<uint64_t> g_hostWaits{0}, g_deviceWaits{0};
// Nanoseconds this process's node ops spent waiting for their own device work (settle) and for
// their node's peers at host barriers: where an op's time goes (the benchmark's columns).
std::atomic<uint64_t> g_settleNs{0}, g_barrierNs{0};

uint64_t nanosSince(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
}
void settleTimed(const node::DeviceSlots& dev) {
  const auto start = std::chrono::steady_clock::now();
  dev.settle();
  g_settleNs.fetch_add(nanosSince(start), std::memory_order_relaxed);
}

// One op's view of the node: slots in host shared memory, or in device memory (dev) with the
// host segment as the barrier, or the device slots' own (node/DeviceSlots.hpp: ordering).
struct NodeOp {
  Context& c;
  Node& node;
  SharedSegment& seg;
  node::DeviceSlots* dev;  // null: host slots
  const Topology& topo;
  const char* op;
  int rank;             // in the group, for errors
  bool devicePointers;  // across nodes, MPI takes the device slots' tensors as they are
  bool onHost() const { return dev == nullptr; }
  int64_t slotBytes() const { return dev ? dev->slotBytes() : seg.slotBytes(); }
  // This rank's writes to its slots are complete (device work waited for), then the barrier;
  // or both queued on the device. `wroteForPeers` false: this rank wrote nothing its peers read
  // after this barrier, so its device work need not finish first (on a GPU that the ranks share,
  // a wait for it would cost a switch to this rank's time slice).
  void sync(bool wroteForPeers = true) {
    if (dev && dev->ordersOnDevice()) {
      g_deviceWaits.fetch_add(1, std::memory_order_relaxed);
      return dev->barrier(op, rank);
    }
    g_hostWaits.fetch_add(1, std::memory_order_relaxed);
    if (dev && wroteForPeers) settleTimed(*dev);
    const auto start = std::chrono::steady_clock::now();
    seg.sync(op, rank, node.cancelled());
    g_barrierNs.fetch_add(nanosSince(start), std::memory_order_relaxed);
  }
  void flip() {
    seg.flip();
    if (dev) dev->flip();
  }
  at::Tensor slot(int r, at::ScalarType t, int64_t n) const {
    return dev ? dev->slot(r, t, n) : seg.slot(r, t, n);
  }
};

// The memory MPI uses for `t` between nodes: host memory as it is; device memory itself where
// the op's link hands MPI device pointers (a CUDA-aware MPI, ops from CUDA_DIRECT_BYTES), once
// the kernels that wrote it have finished (MPI does not see streams); else a host copy.
at::Tensor forMpi(const NodeOp& o, const at::Tensor& t) {
  if (t.is_cpu()) return t;
  if (o.devicePointers) {
    settleTimed(*o.dev);
    return t;
  }
  return t.to(at::kCPU);
}
// What MPI wrote into forMpi(o, t), back in `t`.
void fromMpi(const at::Tensor& t, const at::Tensor& written) {
  if (!written.is_same(t)) t.copy_(written);
}
template <typename F>
void acrossNodes(const NodeOp& o, const at::Tensor& t, F&& mpiOn) {
  at::Tensor m = forMpi(o, t);
  mpiOn(m);
  fromMpi(t, m);
}

// The reduction across nodes is MPI's: no AVG division (done once, at the end) and no PREMUL
// factor (applied to the inputs before anything was summed).
mpi::Reduction plainSum(const mpi::Reduction& red) {
  mpi::Reduction r = red;
  r.divideBySize = false;
  r.premulScalar.reset();
  r.premulTensor = at::Tensor();
  return r;
}

// dst = sources[0] op sources[1] op ... in the order given, times `scale` at the last step.
// dst may be sources[0] (and only that one: it is read first). `also` (optional) gets the result
// too, from the last step's pass where the reducer can (it may be sources[0]).
void combineAll(Context& c, const at::Tensor& dst, const std::vector<at::Tensor>& sources,
                double scale, const at::Tensor& also = {}) {
  const size_t k = sources.size();
  if (k == 1) {
    if (!dst.is_same(sources[0])) dst.copy_(sources[0]);
    if (scale != 1.0) dst.mul_(scale);
    if (also.defined() && !also.is_same(dst)) also.copy_(dst);
    return;
  }
  auto step = [&](const at::Tensor& a, size_t j) {
    const double s = j == k - 1 ? scale : 1.0;
    if (j == k - 1 && also.defined())
      c.reducer.combineToBoth(dst, also, a, sources[j], s);
    else
      c.reducer.combine(dst, a, sources[j], s);
  };
  step(sources[0], 1);
  for (size_t j = 2; j < k; ++j) step(dst, j);
}

// The same range [off, off+len) of every local rank's slot, starting at `first` and going round.
std::vector<at::Tensor> slotRanges(const NodeOp& o, at::ScalarType t, int64_t slotElems,
                                   int64_t off, int64_t len, int first) {
  std::vector<at::Tensor> v;
  const int L = o.topo.localSize;
  for (int j = 0; j < L; ++j)
    v.push_back(o.slot((first + j) % L, t, slotElems).narrow(0, off, len));
  return v;
}

// Small SUMs (the latency-bound case: gradients' norms, loss values, flags) in a plain loop over
// the slots, without building tensors: the same additions in the same order as the reducer's.
constexpr int64_t kSmallBytes = 4096;

// out[i] = the sum over the node's slots j of slot_j[offset + i], in slot order, times `scale`.
template <typename T>
void sumSlots(const NodeOp& o, T* out, int64_t offset, int64_t n, double scale) {
  const int L = o.topo.localSize;
  const T* first = reinterpret_cast<const T*>(o.seg.slotData(0)) + offset;
  for (int64_t i = 0; i < n; ++i) {
    T acc = first[i];
    for (int j = 1; j < L; ++j) acc += reinterpret_cast<const T*>(o.seg.slotData(j))[offset + i];
    out[i] = scale != 1.0 ? static_cast<T>(acc * static_cast<T>(scale)) : acc;
  }
}

// Whether `in` takes the small path: a float/double SUM (AVG, PREMUL_SUM) of at most
// kSmallBytes on one node.
bool small(const NodeOp& o, const at::Tensor& in) {
  const auto t = in.scalar_type();
  return o.onHost() && arithmeticOf(o.c.red.kind) == c10d::ReduceOp::SUM && o.topo.nodes == 1 &&
         in.numel() * in.element_size() <= kSmallBytes && (t == at::kFloat || t == at::kDouble);
}

// Copies `in` (contiguous, host) into this rank's slot, waits for the node, and sums the slots'
// elements [offset, offset + out.numel()) into `out` (which may be `in`).
void smallSum(NodeOp& o, const at::Tensor& in, const at::Tensor& out, int64_t offset,
              double scale) {
  std::memcpy(o.seg.slotData(o.topo.localRank), in.const_data_ptr(),
              in.numel() * in.element_size());
  o.sync();
  if (in.scalar_type() == at::kFloat)
    sumSlots<float>(o, out.data_ptr<float>(), offset, out.numel(), scale);
  else
    sumSlots<double>(o, out.data_ptr<double>(), offset, out.numel(), scale);
  o.flip();
}

// Two-shot on one piece, in one slice per lane (the node's ranks, or across nodes that hold
// different counts the first `lanes` of each node's): the slices the peers reduce go to this
// rank's slot; a lane's rank reduces its own slice (its own input first, then the peers' slots
// round from the next rank) into its slot, across nodes over MPI too; then every rank copies
// every slice.
void twoShotPiece(NodeOp& o, const at::Tensor& part, double scale) {
  const Topology& t = o.topo;
  const int L = t.localSize, me = t.localRank, lanes = t.lanes;
  const auto dtype = part.scalar_type();
  const int64_t m = part.numel();
  const Blocks blk{m, lanes};
  auto slice = [&](const at::Tensor& x, int b) {
    return x.narrow(0, blk.offset(b), blk.length(b));
  };
  const at::Tensor slot = o.slot(me, dtype, m);
  for (int j = 0; j < lanes; ++j)
    if (j != me) slice(slot, j).copy_(slice(part, j));
  o.sync();
  if (me < lanes && blk.length(me) > 0) {
    std::vector<at::Tensor> sources{slice(part, me)};
    for (int j = 1; j < L; ++j) sources.push_back(slice(o.slot((me + j) % L, dtype, m), me));
    at::Tensor mine = slice(slot, me);
    combineAll(o.c, mine, sources, t.nodes == 1 ? scale : 1.0);
    if (t.nodes > 1) {
      acrossNodes(o, mine, [&](at::Tensor h) {
        mpi::allreduceInPlace(t.crossComm, o.op, h, plainSum(o.c.red), /*counted=*/false);
      });
      if (scale != 1.0) mine.mul_(scale);
    }
  }
  o.sync();
  for (int j = 0; j < lanes; ++j) slice(part, j).copy_(slice(o.slot(j, dtype, m), j));
}

// Leader form (Node::leaderForm): the node's first rank reduces every piece for all. Its peers
// copy their inputs into their slots; it reads them and its own input in place, in rank order (the
// one-shot's order and bits), into its own slot and its own output in one pass; they copy the
// result out. On a GPU that the ranks share, only two switches between their time slices per
// piece (peers -> leader -> peers), where one-shot takes four and two-shot six
// (benchmarks/cost_model.py).
void leaderPiece(NodeOp& o, const at::Tensor& part, double scale) {
  const int L = o.topo.localSize, me = o.topo.localRank;
  const auto dtype = part.scalar_type();
  const int64_t m = part.numel();
  if (me != 0) o.slot(me, dtype, m).copy_(part);
  o.sync(/*wroteForPeers=*/me != 0);  // the leader's input is read by its own stream only
  const at::Tensor result = o.slot(0, dtype, m);
  if (me == 0) {
    std::vector<at::Tensor> sources{part};
    for (int j = 1; j < L; ++j) sources.push_back(o.slot(j, dtype, m));
    combineAll(o.c, result, sources, scale, /*also=*/part);  // one pass writes both
  }
  o.sync(/*wroteForPeers=*/me == 0);
  if (me != 0) part.copy_(result);
}

// In place on the host tensor `buf`, in pieces of one slot.
void allreduceOnHost(NodeOp& o, const at::Tensor& buf) {
  prescale(o.c, buf, /*inPlace=*/true);
  const Topology& t = o.topo;
  const int me = t.localRank;
  const auto dtype = buf.scalar_type();
  const double scale = finalScale(o.c, t.size);
  if (small(o, buf)) return smallSum(o, buf, buf, 0, scale);
  const int64_t chunk = o.slotBytes() / buf.element_size();
  // one-shot: every rank reduces all slots in rank order (the same bits everywhere); two-shot:
  // each rank reduces its 1/L, then all copy every slice
  const bool oneShot = t.nodes == 1 && buf.numel() * buf.element_size() <= o.node.oneShotBytes();
  const bool leader = t.nodes == 1 && o.node.leaderForm(o.dev);
  forPieces(buf.numel(), chunk, [&](int64_t off, int64_t m) {
    at::Tensor part = buf.narrow(0, off, m);
    if (leader) {
      leaderPiece(o, part, scale);
    } else if (oneShot) {
      o.slot(me, dtype, m).copy_(part);
      o.sync();
      combineAll(o.c, part, slotRanges(o, dtype, m, 0, m, 0), scale);
    } else {
      twoShotPiece(o, part, scale);
    }
    o.flip();
  });
}

// Nodes holding different counts, each piece in two steps: a lane's rank sums on its node the
// blocks of every rank that crosses nodes in its lane (Topology::carried, on every node), and
// MPI_Reduce_scatter among the lane's ranks leaves it its node's share, its own block first; then
// it hands the rest to its node's ranks above the lanes through its slot.
void reduceScatterUneven(NodeOp& o, const at::Tensor& input, const at::Tensor& out) {
  const Topology& t = o.topo;
  const int L = t.localSize, me = t.localRank, lanes = t.lanes, p = t.size;
  const auto dtype = out.scalar_type();
  const int64_t m = out.numel();
  const at::Tensor rows = input.view({p, m});
  const double scale = finalScale(o.c, p);
  std::vector<int> blocks;      // a lane's rank's: in its crossComm's order of nodes
  std::vector<int64_t> counts;  // of those blocks per node
  if (me < lanes) {
    for (int n : t.laneNodes[me]) {
      const std::vector<int> c = t.carried(n, me);
      blocks.insert(blocks.end(), c.begin(), c.end());
      counts.push_back(static_cast<int64_t>(c.size()));
    }
  }
  const int lane = me % lanes, q = me / lanes;  // this rank's result: block q of what `lane` gets
  const int64_t ours = static_cast<int64_t>(t.carried(t.node, lane).size());
  const int64_t cols = std::max<int64_t>(1, o.slotBytes() / (out.element_size() * p));
  forPieces(m, cols, [&](int64_t off, int64_t w) {
    o.slot(me, dtype, p * w).view({p, w}).copy_(rows.narrow(1, off, w));
    o.sync();
    at::Tensor back;  // this node's blocks of the lane, reduced over every node
    if (me < lanes) {
      at::Tensor sums = at::empty({static_cast<int64_t>(blocks.size()) * w}, out.options());
      for (size_t k = 0; k < blocks.size(); ++k)
        combineAll(o.c, sums.narrow(0, k * w, w), slotRanges(o, dtype, p * w, blocks[k] * w, w, 0),
                   1.0);
      std::vector<int64_t> elems;
      for (int64_t c : counts) elems.push_back(c * w);
      back = at::empty({ours * w}, out.options());
      at::Tensor received = forMpi(o, back);
      mpi::reduceScatterV(t.crossComm, o.op, forMpi(o, sums), received, elems, plainSum(o.c.red),
                          /*counted=*/false);
      fromMpi(back, received);
      combineAll(o.c, out.narrow(0, off, w), {back.narrow(0, 0, w)}, scale);
    }
    o.flip();
    if (L == lanes) return;  // no rank of this node above the lanes
    if (me < lanes && ours > 1)
      o.slot(me, dtype, (ours - 1) * w).copy_(back.narrow(0, w, (ours - 1) * w));
    o.sync();
    if (me >= lanes)
      combineAll(o.c, out.narrow(0, off, w),
                 {o.slot(lane, dtype, (ours - 1) * w).narrow(0, (q - 1) * w, w)}, scale);
    o.flip();
  });
}

// Leader form of a one-node reduce_scatter piece (leaderPiece): `cols` is this rank's p x w
// columns of the input, `dst` its w results. The leader sums block j of every rank (its own
// input in place, then the peers' slots, in rank order: the bits of the form where each rank
// reduces its own) into block j of its own slot, its own block straight into `dst`; each peer
// copies its block out.
void reduceScatterLeaderPiece(NodeOp& o, const at::Tensor& cols, const at::Tensor& dst,
                              double scale) {
  const int L = o.topo.localSize, me = o.topo.localRank;
  const auto dtype = dst.scalar_type();
  const int64_t w = dst.numel();
  if (me != 0) o.slot(me, dtype, L * w).view({L, w}).copy_(cols);
  o.sync(/*wroteForPeers=*/me != 0);
  const at::Tensor results = o.slot(0, dtype, L * w).view({L, w});
  if (me == 0) {
    std::vector<at::Tensor> peers;  // each peer's slot as L blocks, made once per piece
    for (int r = 1; r < L; ++r) peers.push_back(o.slot(r, dtype, L * w).view({L, w}));
    for (int j = 0; j < L; ++j) {
      std::vector<at::Tensor> sources{cols[j]};
      for (const at::Tensor& peer : peers) sources.push_back(peer[j]);
      combineAll(o.c, j == 0 ? dst : results[j], sources, scale);
    }
  }
  o.sync(/*wroteForPeers=*/me == 0);
  if (me != 0) dst.copy_(results[me]);
}

// `in` holds size x out.numel() elements in group rank order; this rank's block reduced to out.
void reduceScatterOnHost(NodeOp& o, const at::Tensor& in, const at::Tensor& out) {
  const Topology& t = o.topo;
  const int L = t.localSize, me = t.localRank, p = t.nodes * L;
  const auto dtype = out.scalar_type();
  const int64_t m = out.numel();
  const at::Tensor input = prescale(o.c, in, /*inPlace=*/false);
  if (small(o, input)) return smallSum(o, input, out, me * m, finalScale(o.c, p));
  if (!t.uniform) return reduceScatterUneven(o, input, out);
  const at::Tensor rows = input.view({p, m});
  const int64_t cols = std::max<int64_t>(1, o.slotBytes() / (out.element_size() * p));
  const double scale = finalScale(o.c, p);
  if (t.nodes == 1 && o.node.leaderForm(o.dev)) {
    // the leader reads its input in place after writing its output: apart, if they overlap
    const at::Tensor held = me == 0 && overlaps(input, out) ? rows.clone() : rows;
    forPieces(m, cols, [&](int64_t off, int64_t w) {
      reduceScatterLeaderPiece(o, held.narrow(1, off, w), out.narrow(0, off, w), scale);
      o.flip();
    });
    return;
  }
  forPieces(m, cols, [&](int64_t off, int64_t w) {
    o.slot(me, dtype, p * w).view({p, w}).copy_(rows.narrow(1, off, w));
    o.sync();
    at::Tensor dst = out.narrow(0, off, w);
    if (t.nodes == 1) {
      combineAll(o.c, dst, slotRanges(o, dtype, p * w, me * w, w, 0), scale);
    } else {
      // the node's sum of every block this rank's cross-node peers own, then MPI's
      // reduce_scatter among those peers
      at::Tensor mine = at::empty({t.nodes * w}, out.options());
      for (int i = 0; i < t.nodes; ++i) {
        combineAll(o.c, mine.narrow(0, i * w, w),
                   slotRanges(o, dtype, p * w, t.placement[me * t.nodes + i] * w, w, 0), 1.0);
      }
      at::Tensor received = forMpi(o, dst);
      mpi::reduceScatter(t.crossComm, o.op, forMpi(o, mine), received, plainSum(o.c.red),
                         /*counted=*/false);
      fromMpi(dst, received);
      if (scale != 1.0) dst.mul_(scale);
    }
    o.flip();
  });
}

// The root's buf gets the reduction; the others' buf is only read.
void reduceOnHost(NodeOp& o, const at::Tensor& buf, int root) {
  const Topology& t = o.topo;
  if (t.nodes > 1) {  // across nodes: the hierarchical all_reduce, on a copy off the root
    at::Tensor work = o.c.link.comm().rank == root ? buf : buf.clone();
    allreduceOnHost(o, work);
    return;
  }
  const int L = t.localSize, me = t.localRank;
  const auto dtype = buf.scalar_type();
  const double scale = finalScale(o.c, L);
  const int64_t chunk = o.slotBytes() / buf.element_size();
  const at::Tensor in = prescale(o.c, buf, /*inPlace=*/false);
  forPieces(buf.numel(), chunk, [&](int64_t off, int64_t m) {
    o.slot(me, dtype, m).copy_(in.narrow(0, off, m));
    o.sync();
    if (me == root) combineAll(o.c, buf.narrow(0, off, m), slotRanges(o, dtype, m, 0, m, 0), scale);
    o.flip();
  });
}

// Data movement copies bytes, whatever the dtype: a host pointer (memcpy, no tensor built per
// slot), or a device tensor of bytes (a copy on the current stream).
struct ByteSpan {
  uint8_t* host = nullptr;
  at::Tensor dev;
  void copyFrom(int64_t at, const ByteSpan& src, int64_t from, int64_t n) const {
    if (host != nullptr) {
      std::memcpy(host + at, src.host + from, n);
    } else {
      dev.narrow(0, at, n).copy_(src.dev.narrow(0, from, n));
    }
  }
};
ByteSpan spanOf(const NodeOp& o, const at::Tensor& t) {
  if (o.onHost()) return {static_cast<uint8_t*>(t.data_ptr()), {}};
  return {nullptr, t.view({-1}).view(at::kByte)};
}
ByteSpan slotSpan(const NodeOp& o, int r, int64_t bytes) {
  if (o.onHost()) return {o.seg.slotData(r), {}};
  return {nullptr, o.slot(r, at::kByte, bytes)};
}

// Rows a local rank holds for its node: row `held` of what it holds goes to row `to` of every
// rank's output. rows[j]: local rank j's.
struct RowMove {
  int64_t held, to;
};
using RowsOnNode = std::vector<std::vector<RowMove>>;

// Every local rank's rows to every rank of the node, in one copy: each rank publishes what it
// holds and reads every peer's rows straight into `out` (process_vm_readv), where the slots cost
// two copies of each row (into the writer's slot, out of it). The second barrier keeps `held`
// unchanged until every peer has read it. Rows are read from the next local rank round, so peers
// do not all read one rank first.
void shareRowsInPlace(NodeOp& o, const at::Tensor& held, const RowsOnNode& rows, int64_t rowBytes,
                      const at::Tensor& out) {
  const int L = o.topo.localSize, me = o.topo.localRank;
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const auto* src = static_cast<const uint8_t*>(held.const_data_ptr());
  o.seg.publish(src);
  o.sync();
  for (int k = 0; k < L; ++k) {
    const int j = (me + k) % L;
    for (const RowMove& mv : rows[j]) {
      uint8_t* to = dst + mv.to * rowBytes;
      if (j != me) {
        o.seg.readPublished(j, to, mv.held * rowBytes, rowBytes, o.op, o.rank);
      } else if (to != src + mv.held * rowBytes) {  // in place (held as a view of its row): done
        std::memcpy(to, src + mv.held * rowBytes, rowBytes);
      }
    }
  }
  o.sync();
}

// Every local rank's rows to every rank of the node: in one copy where the node allows it
// (shareRowsInPlace), else through the slots in pieces, each the same byte range of every row a
// rank holds.
void shareRows(NodeOp& o, const at::Tensor& held, const RowsOnNode& rows, int64_t rowBytes,
               const at::Tensor& out) {
  const int L = o.topo.localSize, me = o.topo.localRank;
  const int64_t eb = out.element_size();
  size_t most = 1;
  for (const auto& r : rows) most = std::max(most, r.size());
  MPIGPU_CHECK_VALUE(static_cast<int64_t>(most) * eb <= o.slotBytes(), o.op, o.rank,
                     "a node's slot (", o.slotBytes(), " bytes) must hold one element of each of ",
                     most, " rows; raise TORCH_MPIGPU_NODE_BUFFER_BYTES");
  // A held row inside `out` anywhere but its own place (all_gather_into_tensor(out, out[k]), k
  // another rank): the copies into `out` would overwrite it before the peers have read it.
  const auto* dst = static_cast<const uint8_t*>(out.const_data_ptr());
  const bool inItsPlace = rows[me].size() == 1 && held.numel() * held.element_size() == rowBytes &&
                          held.const_data_ptr() == dst + rows[me][0].to * rowBytes;
  const at::Tensor mine = overlaps(held, out) && !inItsPlace ? held.clone() : held;
  if (o.onHost() && o.node.singleCopy(rowBytes))
    return shareRowsInPlace(o, mine, rows, rowBytes, out);
  const ByteSpan from = spanOf(o, mine), into = spanOf(o, out);
  const int64_t width = std::max<int64_t>(eb, o.slotBytes() / static_cast<int64_t>(most) / eb * eb);
  // the leader form (leaderPiece): the peers place their rows, then the leader places its own and
  // takes every row, then the peers take theirs; one more barrier, two switches on a shared GPU
  const bool leader = o.node.leaderForm(o.dev);
  forPieces(rowBytes, width, [&](int64_t off, int64_t w) {
    auto place = [&] {
      if (rows[me].empty()) return;
      const ByteSpan mySlot = slotSpan(o, me, static_cast<int64_t>(rows[me].size()) * w);
      for (size_t i = 0; i < rows[me].size(); ++i)
        mySlot.copyFrom(i * w, from, rows[me][i].held * rowBytes + off, w);
    };
    auto take = [&] {
      for (int j = 0; j < L; ++j) {
        if (rows[j].empty()) continue;
        const ByteSpan theirs = slotSpan(o, j, static_cast<int64_t>(rows[j].size()) * w);
        for (size_t i = 0; i < rows[j].size(); ++i)
          into.copyFrom(rows[j][i].to * rowBytes + off, theirs, i * w, w);
      }
    };
    if (!leader || me != 0) place();
    o.sync(/*wroteForPeers=*/!leader || me != 0);
    if (leader) {
      if (me == 0) {
        place();
        take();
      }
      o.sync(/*wroteForPeers=*/me == 0);
      if (me != 0) take();
    } else {
      take();
    }
    o.flip();
  });
}

// Nodes holding different counts: every rank's row to its node first (these rows are final),
// then each lane's share of the node's rows (Topology::carried) to the other nodes in one
// MPI_Allgatherv among the lane's ranks, then what each lane got to the rest of its node. Each
// node's rows cross the network once per other node, as with the same count on every node.
void allgatherUneven(NodeOp& o, const at::Tensor& in, const at::Tensor& out) {
  const Topology& t = o.topo;
  const int L = t.localSize, me = t.localRank, lanes = t.lanes;
  const int64_t numel = in.numel(), rowBytes = numel * in.element_size();
  const std::vector<int>& ours = t.members[t.node];
  RowsOnNode own(L);
  for (int j = 0; j < L; ++j) own[j] = {{0, ours[j]}};
  shareRows(o, in.contiguous(), own, rowBytes, out);
  // what lane j gets: every node's rows of that lane, in its crossComm order (ours skipped: here)
  RowsOnNode others(L);
  for (int j = 0; j < lanes; ++j) {
    int64_t at = 0;
    for (int n : t.laneNodes[j])
      for (int r : t.carried(n, j)) {
        if (n != t.node) others[j].push_back({at, r});
        ++at;
      }
  }
  at::Tensor received = at::empty({0}, out.options());
  if (me < lanes) {
    const std::vector<int> sent = t.carried(t.node, me);
    const at::Tensor which = at::tensor(std::vector<int64_t>(sent.begin(), sent.end()),
                                        at::TensorOptions().dtype(at::kLong))
                                 .to(out.device());
    const at::Tensor send = forMpi(o, out.view({t.size, numel}).index_select(0, which).view({-1}));
    std::vector<int64_t> counts;
    for (int n : t.laneNodes[me])
      counts.push_back(static_cast<int64_t>(t.carried(n, me).size()) * numel);
    at::Tensor gathered =
        at::empty({static_cast<int64_t>(others[me].size() + sent.size()) * numel}, send.options());
    mpi::allgatherv(t.crossComm, o.op, send, gathered, counts, /*counted=*/false);
    received = gathered.to(out.device());
  }
  shareRows(o, received, others, rowBytes, out);
}

// `out` (contiguous, size x in.numel() elements, group rank order) gets every rank's `in`.
// Across nodes, the blocks of this rank's cross-node peers first (one MPI_Allgather among the
// same local index: each node's data crosses the network once per peer, not once per hop of a
// ring), then the node's ranks share what they hold through the slots.
void allgatherOnHost(NodeOp& o, const at::Tensor& in, const at::Tensor& out) {
  const Topology& t = o.topo;
  if (!t.uniform) return allgatherUneven(o, in, out);
  const int L = t.localSize, N = t.nodes;
  at::Tensor mine = in.contiguous();
  if (N > 1) {
    const at::Tensor send = forMpi(o, mine);
    at::Tensor gathered = at::empty({N * in.numel()}, send.options());
    mpi::allgather(t.crossComm, o.op, send, gathered, /*counted=*/false);
    mine = gathered.to(in.device());
  }
  RowsOnNode rows(L);
  for (int j = 0; j < L; ++j)
    for (int i = 0; i < N; ++i) rows[j].push_back({i, t.placement[static_cast<size_t>(j) * N + i]});
  shareRows(o, mine, rows, in.numel() * in.element_size(), out);
}

// The root's `buf` to every rank: across nodes over MPI among the root's local index first,
// then inside each node from that index's slot, piece by piece. Where nodes hold different
// counts and the root is above the lanes, its node gets it first and lane 0 carries it across.
void broadcastOnHost(NodeOp& o, const at::Tensor& buf, int root) {
  const Topology& t = o.topo;
  const Topology::Carrier c = t.carrierOf(root);
  // Through the slots, not single copy (as all_gather): here the root's copy of one piece into
  // its slot overlaps the readers' copies of the last, where reading the root's buffer in place
  // leaves all the copying to the readers, and the kernel's copy is slower than memcpy: single
  // copy loses from about 2 MiB (docs/performance.md).
  const ByteSpan data = spanOf(o, buf);
  auto fromSlotOf = [&](int local) {
    const bool source = t.localRank == local;
    forPieces(buf.numel() * buf.element_size(), o.slotBytes(), [&](int64_t off, int64_t m) {
      const ByteSpan slot = slotSpan(o, local, m);
      if (source) slot.copyFrom(0, data, off, m);
      o.sync();
      if (!source) data.copyFrom(off, slot, 0, m);
      o.flip();
    });
  };
  const bool relayed = c.lane != c.rootLocal;
  if (relayed && c.onRootNode) fromSlotOf(c.rootLocal);
  if (t.nodes > 1 && t.localRank == c.lane) {
    acrossNodes(o, buf, [&](at::Tensor h) { mpi::broadcast(t.crossComm, o.op, h, c.crossRoot); });
  }
  if (!(relayed && c.onRootNode)) fromSlotOf(c.lane);
}

// Runs fn(op context, tensors where the node works on them): in device slots where every member
// has a GPU (a tensor of another device moved there), else in host shared memory (a tensor of
// another device copied to the host); the written ones are copied back. Every rank of the group
// makes the same choice: it depends only on what was agreed when the group and slots were made.
// `wantBytes`: the slot size in which the op would take one piece (device slots grow toward it).
template <typename F>
bool onNode(Context& c, std::vector<at::Tensor> tensors, std::vector<bool> written,
            int64_t wantBytes, F&& fn) {
  Node* node = c.node;
  const char* op = c.link.op();
  SharedSegment* seg = node != nullptr && node->suits() ? node->segment(op) : nullptr;
  if (seg == nullptr) return false;
  node::DeviceSlots* dev =
      node->onDevice() ? node->deviceSlots(op, tensors[0].device(), wantBytes) : nullptr;
  if (node->onDevice() && dev == nullptr) return false;
  const at::Device where = dev != nullptr ? dev->device() : at::Device(at::kCPU);
  std::vector<at::Tensor> work;
  bool moved = false;
  for (const auto& t : tensors) {
    const bool here = t.device() == where;
    moved = moved || !here;
    work.push_back(here ? t : t.to(where));
  }
  // moved tensors are reduced by the reducer of the memory they were moved to
  std::unique_ptr<Reducer> reducer;
  if (moved) reducer = dev != nullptr ? dev->reducer(c.red.kind) : makeHostReducer(c.red.kind);
  Context wc{c.link, moved ? *reducer : c.reducer, c.red, c.pieceElems, c.node};
  // device pointers across nodes only for the op's own device memory (not a moved copy)
  NodeOp o{wc,
           *node,
           *seg,
           dev,
           node->topology(),
           op,
           c.link.comm().rank,
           dev != nullptr && !moved && c.link.takesDevicePointers()};
  if (dev != nullptr) dev->checkBarriers(op, o.rank);  // an earlier op's barrier gave up
  {
    // Every rank of the node copies and reduces at once, typically one rank per core: ATen's
    // intra-op threads would only take cores from the peers this rank waits for.
    c10::ParallelGuard serial(true);
    fn(o, work);
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    if (written[i] && !tensors[i].is_same(work[i])) tensors[i].copy_(work[i]);
  return true;
}

int64_t bytesOf(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Tests only: host shared memory as "device" slots. With NODE_DEVICE_ORDER=device they order the
// ranks themselves, as device flags do, through their own segment's barrier.
class HostDeviceSlots final : public node::DeviceSlots {
 public:
  HostDeviceSlots(std::unique_ptr<SharedSegment> seg, node::Ordering ordering)
      : seg_(std::move(seg)), ownBarrier_(ordering == node::Ordering::Device) {}
  at::Device device() const override { return at::Device(at::kCPU); }
  int64_t slotBytes() const override { return seg_->slotBytes(); }
  at::Tensor slot(int rank, at::ScalarType dtype, int64_t elems) const override {
    return seg_->slot(rank, dtype, elems);
  }
  void flip() override { seg_->flip(); }
  void settle() const override {}
  std::unique_ptr<Reducer> reducer(c10d::ReduceOp::RedOpType kind) const override {
    return makeHostReducer(kind);
  }
  bool ordersOnDevice() const override { return ownBarrier_; }
  void barrier(const char* op, int rank) override { seg_->sync(op, rank, never_); }
  std::string ordering() const override {
    return ownBarrier_ ? "ordered by the slots themselves (tests: their own barrier)"
                       : "ordered from the host";
  }

 private:
  std::unique_ptr<SharedSegment> seg_;
  const bool ownBarrier_;
  const std::atomic<bool> never_{false};
};

}  // namespace

node::DeviceSlotsMaker hostDeviceSlotsForTests() {
  return [](const mpi::Comm& nodeComm, const node::SlotsSpec& spec, const at::Device&,
            const char* op, int rank, std::string* why) -> std::unique_ptr<node::DeviceSlots> {
    auto seg = SharedSegment::create(nodeComm, spec.slotBytes, op, rank, why);
    if (!seg) return nullptr;
    return std::make_unique<HostDeviceSlots>(std::move(seg), spec.ordering);
  };
}

NodeWaits nodeWaits() {
  return {
      g_hostWaits.load(std::memory_order_relaxed), g_deviceWaits.load(std::memory_order_relaxed),
      SharedSegment::yieldsToPeerOnThisCpu(),      SharedSegment::singleCopyReads(),
      g_settleNs.load(std::memory_order_relaxed),  g_barrierNs.load(std::memory_order_relaxed)};
}

bool nodeAllreduce(Context& c, const at::Tensor& buf) {
  return onNode(c, {buf}, {true}, bytesOf(buf),
                [](NodeOp& o, std::vector<at::Tensor>& h) { allreduceOnHost(o, h[0]); });
}

bool nodeReduceScatter(Context& c, const at::Tensor& in, const at::Tensor& out) {
  return onNode(c, {in, out}, {false, true}, bytesOf(in),
                [](NodeOp& o, std::vector<at::Tensor>& h) { reduceScatterOnHost(o, h[0], h[1]); });
}

bool nodeReduce(Context& c, const at::Tensor& buf, int root) {
  return onNode(c, {buf}, {true}, bytesOf(buf),
                [root](NodeOp& o, std::vector<at::Tensor>& h) { reduceOnHost(o, h[0], root); });
}

namespace {

// The most rows one rank's slot holds in an all_gather: its row of every node where every node
// holds the same count, else what the fullest lane gets from every node.
int64_t rowsInSlot(const Topology& t) {
  if (t.uniform) return t.nodes;
  int64_t most = 1;
  for (int j = 0; j < t.lanes; ++j) {
    int64_t rows = 0;
    for (int n : t.laneNodes[j]) rows += static_cast<int64_t>(t.carried(n, j).size());
    most = std::max(most, rows);
  }
  return most;
}

}  // namespace

bool nodeAllgather(Context& c, const at::Tensor& in, const at::Tensor& out) {
  TORCH_INTERNAL_ASSERT(out.is_contiguous(), "mpigpu: all_gather's output must be contiguous");
  const int64_t rows = c.node != nullptr ? rowsInSlot(c.node->topology()) : 1;
  return onNode(c, {in, out}, {false, true}, rows * bytesOf(in),
                [](NodeOp& o, std::vector<at::Tensor>& h) { allgatherOnHost(o, h[0], h[1]); });
}

bool nodeBroadcast(Context& c, const at::Tensor& buf, int root) {
  TORCH_INTERNAL_ASSERT(buf.is_contiguous(), "mpigpu: broadcast's buffer must be contiguous");
  return onNode(c, {buf}, {true}, bytesOf(buf),
                [root](NodeOp& o, std::vector<at::Tensor>& h) { broadcastOnHost(o, h[0], root); });
}

}  // namespace mpigpu::algo
