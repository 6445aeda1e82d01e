#include "mpi/Collectives.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/Errors.hpp"
#include "core/KeepUntilExit.hpp"
#include "core/Overlap.hpp"
#include "mpi/Check.hpp"
#include "mpi/Comm.hpp"
#include "mpi/Env.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu::mpi {
namespace {

std::atomic<uint64_t> g_calls{0};

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Calls f(offset, n) over [0, count) in pieces of at most `limit` elements.
template <typename F>
void forChunks(int64_t count, int64_t limit, F&& f) {
  for (int64_t off = 0; off < count; off += limit) {
    f(off, static_cast<int>(std::min(limit, count - off)));
  }
}

// MPI does not see streams: device work we queued on the current stream (a scale, a copy) must
// be finished before MPI reads that memory or writes memory the work still reads.
void settle(const at::Tensor& t) {
  if (t.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).synchronize();
}

// PREMUL_SUM multiplies every input by its factor before summing.
at::Tensor prescaled(const at::Tensor& in, const Reduction& red) {
  if (!red.needsPrescale()) return in;
  at::Tensor out = red.premulTensor.defined()
                       ? in * red.premulTensor.to(in.device(), in.scalar_type())
                       : in * *red.premulScalar;
  settle(out);
  return out;
}

void finishAverage(at::Tensor& out, const Reduction& red, int size) {
  if (red.divideBySize) out.div_(size);
}

}  // namespace

uint64_t callCount() { return g_calls.load(std::memory_order_relaxed); }

MPI_Comm createGroupComm(const std::vector<int>& jobRanks, const std::string& name,
                         int rankForErrors) {
  const char* op = "new_group";
  MPI_Group world = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm comm = MPI_COMM_NULL;
  const JobComm jc = jobComm();
  const MPI_Comm job = jc.comm;
  // Same on every member (torch agrees group names), distinct per group: it tells apart
  // creations that could be concurrent on this communicator.
  const int tag = static_cast<int>(std::hash<std::string>{}(name) % 32000) + 1;
  // serialized: the blocking create starts once every member is here (mpi/Wait.hpp)
  if (jc.arrivals != MPI_COMM_NULL) arriveAmong(jc.arrivals, jobRanks, tag, op, rankForErrors);
  MPIGPU_MPI_CHECK(MPI_Comm_group(job, &world), op, rankForErrors);
  MPIGPU_MPI_CHECK(
      MPI_Group_incl(world, static_cast<int>(jobRanks.size()), jobRanks.data(), &group), op,
      rankForErrors);
  // (ULFM, Open MPI 5: a member failing in here can leave the survivors inside for good, holding
  // the context-id allocation of every communicator made after the job's: see
  // ProcessGroupMPIGPU::shrinkSurvivors. MPI_Comm_create_from_group crashed instead, 11 of 12.)
  const int rc = MPI_Comm_create_group(job, group, tag, &comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  if (rc != MPI_SUCCESS)
    throwMpiError(rc, "MPI_Comm_create_group(job, group, tag, &comm)", op, rankForErrors, __FILE__,
                  __LINE__);
  noteMade(comm);
  // Errors come back as codes (and then exceptions) instead of aborting the job.
  MPIGPU_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), op, rankForErrors);
  return comm;
}

MPI_Comm splitComm(const Comm& parent, const std::vector<int>& ranks, std::vector<int>* made,
                   const char* op) {
  const auto mine = std::find(ranks.begin(), ranks.end(), parent.rank);
  const int color =
      mine == ranks.end() ? MPI_UNDEFINED : *std::min_element(ranks.begin(), ranks.end());
  arriveTogether(parent, op);
  MPI_Comm child = MPI_COMM_NULL;
  MPIGPU_MPI_CHECK(
      MPI_Comm_split(parent.handle, color, static_cast<int>(mine - ranks.begin()), &child), op,
      parent.rank);
  if (child == MPI_COMM_NULL) return child;
  noteMade(child);
  int n = 0;
  MPIGPU_MPI_CHECK(MPI_Comm_size(child, &n), op, parent.rank);
  made->resize(n);
  MPIGPU_MPI_CHECK(MPI_Allgather(&parent.rank, 1, MPI_INT, made->data(), 1, MPI_INT, child), op,
                   parent.rank);
  // agreed over the child, so that all of its members fail or none does
  int same = *made == ranks ? 1 : 0;
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, child), op, parent.rank);
  if (!same) freeComm(&child);
  return child;
}

void allreduceInPlace(const Comm& c, const char* op, at::Tensor& buf, const Reduction& red,
                      bool counted) {
  if (red.needsPrescale()) {
    if (red.premulTensor.defined())
      buf.mul_(red.premulTensor.to(buf.device(), buf.scalar_type()));
    else
      buf.mul_(*red.premulScalar);
    settle(buf);
  }
  arriveTogether(c, op);
  const int64_t es = buf.element_size();
  forChunks(buf.numel(), c.maxCount, [&](int64_t off, int n) {
    if (counted) ++g_calls;
    MPIGPU_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, bytes(buf) + off * es, n, red.type, red.op, c.handle), op,
        c.rank);
  });
  finishAverage(buf, red, c.size);
}

void broadcast(const Comm& c, const char* op, at::Tensor& buf, int root) {
  const MPI_Datatype type = transportType(buf.scalar_type(), op, c.rank);
  arriveTogether(c, op);
  const int64_t es = buf.element_size();
  forChunks(buf.numel(), c.maxCount, [&](int64_t off, int n) {
    ++g_calls;
    MPIGPU_MPI_CHECK(MPI_Bcast(bytes(buf) + off * es, n, type, root, c.handle), op, c.rank);
  });
}

void reduce(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
            const Reduction& red, int root) {
  const at::Tensor send = prescaled(in, red);
  const bool isRoot = c.rank == root;
  const bool inPlace = isRoot && send.data_ptr() == out.data_ptr();
  arriveTogether(c, op);
  const int64_t es = in.element_size();
  forChunks(in.numel(), c.maxCount, [&](int64_t off, int n) {
    ++g_calls;
    const void* sendPtr = inPlace ? MPI_IN_PLACE : bytes(send) + off * es;
    void* recvPtr = isRoot ? bytes(out) + off * es : nullptr;
    MPIGPU_MPI_CHECK(MPI_Reduce(sendPtr, recvPtr, n, red.type, red.op, root, c.handle), op, c.rank);
  });
  if (isRoot) finishAverage(out, red, c.size);
}

void allgather(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out, bool counted) {
  const MPI_Datatype type = transportType(in.scalar_type(), op, c.rank);
  const int64_t count = in.numel();
  if (count == 0) return;
  arriveTogether(c, op);
  at::Tensor src = in;
  if (overlaps(in, out)) {
    // The rank's own slot of the output: MPI_IN_PLACE, as the standard asks.
    if (bytes(in) == bytes(out) + c.rank * count * in.element_size() && count <= c.maxCount) {
      if (counted) ++g_calls;
      MPIGPU_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, bytes(out),
                                     static_cast<int>(count), type, c.handle),
                       op, c.rank);
      return;
    }
    src = in.clone();
    settle(src);
  }
  if (count <= c.maxCount) {
    if (counted) ++g_calls;
    MPIGPU_MPI_CHECK(MPI_Allgather(bytes(src), static_cast<int>(count), type, bytes(out),
                                   static_cast<int>(count), type, c.handle),
                     op, c.rank);
    return;
  }
  // Large blocks: gather column slices of every rank's block, then put them in place.
  at::Tensor outBlocks = out.view({c.size, count});
  forChunks(count, c.maxCount, [&](int64_t off, int n) {
    at::Tensor tmp = at::empty({c.size, n}, out.options());
    if (counted) ++g_calls;
    MPIGPU_MPI_CHECK(MPI_Allgather(bytes(src) + off * src.element_size(), n, type, bytes(tmp), n,
                                   type, c.handle),
                     op, c.rank);
    outBlocks.narrow(1, off, n).copy_(tmp);
    settle(tmp);
  });
}

namespace {

std::vector<int64_t> displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> displ(counts.size(), 0);
  for (size_t p = 1; p < counts.size(); ++p) displ[p] = displ[p - 1] + counts[p - 1];
  return displ;
}

// Blocks of different sizes through MPI calls of at most maxCount elements: in round k every
// rank's block contributes its elements [k * step, (k + 1) * step), so no count or offset of one
// call exceeds maxCount. One round, on the caller's buffers, where everything fits. Every rank
// knows every count, so all agree on the rounds without asking. `call(direct, base, rc, rd)`: one
// round's MPI call, with each rank's count and offset in that round's buffer (the caller's own
// where `direct`, else one packed for the round).
template <typename Round>
void inRounds(const Comm& c, const std::vector<int64_t>& counts, Round call) {
  const std::vector<int64_t> displ = displacements(counts);
  const int64_t total = displ.back() + counts.back();
  const bool direct = total <= c.maxCount;
  const int64_t step = direct ? total : std::max<int64_t>(1, c.maxCount / c.size);
  const int64_t largest = *std::max_element(counts.begin(), counts.end());
  std::vector<int> rc(c.size), rd(c.size);
  for (int64_t base = 0; base < largest; base += step) {
    int off = 0;
    for (int p = 0; p < c.size; ++p) {
      rc[p] = static_cast<int>(std::clamp<int64_t>(counts[p] - base, 0, step));
      rd[p] = direct ? static_cast<int>(displ[p]) : off;
      off += rc[p];
    }
    call(direct, base, rc, rd);
  }
}

}  // namespace

void allgatherv(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
                const std::vector<int64_t>& counts, bool counted) {
  const MPI_Datatype type = transportType(in.scalar_type(), op, c.rank);
  const std::vector<int64_t> displ = displacements(counts);
  if (displ.back() + counts.back() == 0) return;
  arriveTogether(c, op);
  const int64_t es = in.element_size();
  // The input already in its own block of the output (views of one buffer): MPI_IN_PLACE, as the
  // standard asks; any other overlap travels from a copy.
  const bool ownBlock = bytes(in) == bytes(out) + displ[c.rank] * es;
  at::Tensor src = in;
  if (overlaps(in, out) && !ownBlock) {
    src = in.clone();
    settle(src);
  }
  inRounds(c, counts,
           [&](bool direct, int64_t base, const std::vector<int>& rc, const std::vector<int>& rd) {
             at::Tensor tmp = direct ? out : at::empty({rd.back() + rc.back()}, out.options());
             const void* mine = direct && ownBlock ? MPI_IN_PLACE
                                : rc[c.rank] > 0   ? bytes(src) + base * es
                                                   : bytes(src);
             if (counted) ++g_calls;
             MPIGPU_MPI_CHECK(MPI_Allgatherv(mine, rc[c.rank], type, bytes(tmp), rc.data(),
                                             rd.data(), type, c.handle),
                              op, c.rank);
             if (direct) return;
             for (int p = 0; p < c.size; ++p) {
               if (rc[p] > 0)
                 out.narrow(0, displ[p] + base, rc[p]).copy_(tmp.narrow(0, rd[p], rc[p]));
             }
             settle(out);
           });
}

void reduceScatterV(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
                    const std::vector<int64_t>& counts, const Reduction& red, bool counted) {
  const std::vector<int64_t> displ = displacements(counts);
  if (displ.back() + counts.back() == 0) return;
  arriveTogether(c, op);
  const at::Tensor send = prescaled(in, red);
  const bool aliased = overlaps(send, out);
  at::Tensor result = aliased ? at::empty_like(out) : out;
  const int64_t es = send.element_size();
  inRounds(c, counts,
           [&](bool direct, int64_t base, const std::vector<int>& rc, const std::vector<int>& rd) {
             at::Tensor piece = direct ? send : at::empty({rd.back() + rc.back()}, send.options());
             for (int p = 0; !direct && p < c.size; ++p) {
               if (rc[p] > 0)
                 piece.narrow(0, rd[p], rc[p]).copy_(send.narrow(0, displ[p] + base, rc[p]));
             }
             settle(piece);
             char* mine = bytes(result) + (rc[c.rank] > 0 ? base * es : 0);
             if (counted) ++g_calls;
             MPIGPU_MPI_CHECK(
                 MPI_Reduce_scatter(bytes(piece), mine, rc.data(), red.type, red.op, c.handle), op,
                 c.rank);
           });
  if (aliased) out.copy_(result);
  finishAverage(out, red, c.size);
}

void gather(const Comm& c, const char* op, const at::Tensor& in, at::Tensor* out, int root) {
  const MPI_Datatype type = transportType(in.scalar_type(), op, c.rank);
  const int64_t count = in.numel();
  if (count == 0) return;
  arriveTogether(c, op);
  const bool isRoot = c.rank == root;
  at::Tensor src = in;
  if (isRoot && overlaps(in, *out)) {  // no aliased buffers (see overlaps)
    src = in.clone();
    settle(src);
  }
  forChunks(count, c.maxCount, [&](int64_t off, int n) {
    const bool whole = n == count;
    at::Tensor tmp = (isRoot && !whole) ? at::empty({c.size, n}, in.options()) : at::Tensor();
    void* recv = isRoot ? (whole ? bytes(*out) : bytes(tmp)) : nullptr;
    ++g_calls;
    MPIGPU_MPI_CHECK(
        MPI_Gather(bytes(src) + off * src.element_size(), n, type, recv, n, type, root, c.handle),
        op, c.rank);
    if (isRoot && !whole) {
      out->view({c.size, count}).narrow(1, off, n).copy_(tmp);
      settle(tmp);
    }
  });
}

void scatter(const Comm& c, const char* op, const at::Tensor* in, at::Tensor& out, int root) {
  const MPI_Datatype type = transportType(out.scalar_type(), op, c.rank);
  const int64_t count = out.numel();
  if (count == 0) return;
  arriveTogether(c, op);
  const bool isRoot = c.rank == root;
  at::Tensor src = isRoot ? *in : at::Tensor();
  if (isRoot && overlaps(src, out)) {  // no aliased buffers (see overlaps)
    src = src.clone();
    settle(src);
  }
  forChunks(count, c.maxCount, [&](int64_t off, int n) {
    const bool whole = n == count;
    at::Tensor tmp;
    if (isRoot && !whole) {
      tmp = src.view({c.size, count}).narrow(1, off, n).contiguous();
      settle(tmp);
    }
    const void* send = isRoot ? (whole ? bytes(src) : bytes(tmp)) : nullptr;
    ++g_calls;
    MPIGPU_MPI_CHECK(
        MPI_Scatter(send, n, type, bytes(out) + off * out.element_size(), n, type, root, c.handle),
        op, c.rank);
  });
}

void reduceScatter(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
                   const Reduction& red, bool counted) {
  const int64_t count = out.numel();
  if (count == 0) return;
  arriveTogether(c, op);
  const at::Tensor send = prescaled(in, red);
  // The output inside the input (FSDP's in-place reduce_scatter_tensor): MPI_IN_PLACE would put
  // the result at the start of the buffer, not at this rank's block, so reduce into a copy.
  const bool aliased = overlaps(send, out);
  at::Tensor result = aliased ? at::empty_like(out) : out;
  forChunks(count, c.maxCount, [&](int64_t off, int n) {
    const bool whole = n == count;
    at::Tensor piece = whole ? send : send.view({c.size, count}).narrow(1, off, n).contiguous();
    settle(piece);
    if (counted) ++g_calls;
    MPIGPU_MPI_CHECK(
        MPI_Reduce_scatter_block(bytes(piece), bytes(result) + off * result.element_size(), n,
                                 red.type, red.op, c.handle),
        op, c.rank);
  });
  if (aliased) out.copy_(result);
  finishAverage(out, red, c.size);
}

namespace {

// MPI_Alltoallv where some count or offset exceeds an int: rounds of at most `step` elements per
// peer, packed so every offset fits.
void alltoallvInRounds(const Comm& c, const char* op, MPI_Datatype type, const at::Tensor& in,
                       const std::vector<int64_t>& sendCounts,
                       const std::vector<int64_t>& sendDispl, at::Tensor& out,
                       const std::vector<int64_t>& recvCounts,
                       const std::vector<int64_t>& recvDispl, int64_t globalMax) {
  const int64_t step = std::max<int64_t>(1, c.maxCount / c.size);
  const int64_t rounds = (globalMax + step - 1) / step;
  std::vector<int> sc(c.size), sd(c.size), rc(c.size), rd(c.size);
  at::Tensor sendTmp = at::empty({c.size * step}, in.options());
  at::Tensor recvTmp = at::empty({c.size * step}, out.options());
  for (int64_t r = 0; r < rounds; ++r) {
    int sOff = 0, rOff = 0;
    for (int p = 0; p < c.size; ++p) {
      const int64_t base = r * step;
      sc[p] = static_cast<int>(std::clamp<int64_t>(sendCounts[p] - base, 0, step));
      rc[p] = static_cast<int>(std::clamp<int64_t>(recvCounts[p] - base, 0, step));
      sd[p] = sOff;
      rd[p] = rOff;
      if (sc[p] > 0) {
        sendTmp.narrow(0, sOff, sc[p]).copy_(in.narrow(0, sendDispl[p] + base, sc[p]));
      }
      sOff += sc[p];
      rOff += rc[p];
    }
    settle(sendTmp);
    ++g_calls;
    MPIGPU_MPI_CHECK(MPI_Alltoallv(bytes(sendTmp), sc.data(), sd.data(), type, bytes(recvTmp),
                                   rc.data(), rd.data(), type, c.handle),
                     op, c.rank);
    for (int p = 0; p < c.size; ++p) {
      if (rc[p] > 0) {
        out.narrow(0, recvDispl[p] + r * step, rc[p]).copy_(recvTmp.narrow(0, rd[p], rc[p]));
      }
    }
    settle(recvTmp);
  }
}

// One MPI_Alltoallv of packed blocks (counts and offsets in elements), split into rounds where
// some rank's count or offset exceeds what one call takes.
void alltoallvCall(const Comm& c, const char* op, MPI_Datatype type, const at::Tensor& in,
                   const std::vector<int64_t>& sc, const std::vector<int64_t>& sendDispl,
                   at::Tensor& out, const std::vector<int64_t>& rc,
                   const std::vector<int64_t>& recvDispl, int64_t localMax, bool uniform) {
#if MPI_VERSION >= 4
  // MPI-4's large-count call takes every count and offset as it is: no round to agree on
  // splitting (an MPI_Allreduce per call below), unless a lowered limit asks for the rounds.
  if (c.maxCount == INT_MAX) {
    const std::vector<MPI_Count> scC(sc.begin(), sc.end()), rcC(rc.begin(), rc.end());
    const std::vector<MPI_Aint> sdA(sendDispl.begin(), sendDispl.end()),
        rdA(recvDispl.begin(), recvDispl.end());
    ++g_calls;
    MPIGPU_MPI_CHECK(MPI_Alltoallv_c(bytes(in), scC.data(), sdA.data(), type, bytes(out),
                                     rcC.data(), rdA.data(), type, c.handle),
                     op, c.rank);
    return;
  }
#endif
  // Every rank must agree on whether (and in how many rounds) the exchange is split, and only the
  // largest count and offset anywhere decide that.
  int64_t globalMax = localMax;
  if (!uniform) {
    ++g_calls;
    MPIGPU_MPI_CHECK(MPI_Allreduce(&localMax, &globalMax, 1, MPI_INT64_T, MPI_MAX, c.handle), op,
                     c.rank);
  }
  if (globalMax > c.maxCount) {
    alltoallvInRounds(c, op, type, in, sc, sendDispl, out, rc, recvDispl, globalMax);
    return;
  }
  const auto ints = [](const std::vector<int64_t>& v) {
    return std::vector<int>(v.begin(), v.end());
  };
  const std::vector<int> scI = ints(sc), sdI = ints(sendDispl), rcI = ints(rc),
                         rdI = ints(recvDispl);
  ++g_calls;
  MPIGPU_MPI_CHECK(MPI_Alltoallv(bytes(in), scI.data(), sdI.data(), type, bytes(out), rcI.data(),
                                 rdI.data(), type, c.handle),
                   op, c.rank);
}

}  // namespace

void alltoallv(const Comm& c, const char* op, const at::Tensor& input,
               const std::vector<int64_t>& sendCounts, at::Tensor& out,
               const std::vector<int64_t>& recvCounts, bool uniform, bool hostEverywhere) {
  const MPI_Datatype type = transportType(input.scalar_type(), op, c.rank);
  // One tensor as input and output (dist.all_to_all_single(t, t)): the standard forbids aliased
  // buffers, and Open MPI at 3 and 4 ranks returned blocks its exchange had already overwritten.
  at::Tensor in = input;
  if (overlaps(input, out)) {
    in = input.clone();
    settle(in);
  }
  arriveTogether(c, op);
  std::vector<int64_t> sendDispl(c.size, 0), recvDispl(c.size, 0);
  for (int p = 1; p < c.size; ++p) {
    sendDispl[p] = sendDispl[p - 1] + sendCounts[p - 1];
    recvDispl[p] = recvDispl[p - 1] + recvCounts[p - 1];
  }
  const int64_t localMax =
      std::max(sendDispl.back() + sendCounts.back(), recvDispl.back() + recvCounts.back());
  // Uniform counts in a group whose every rank passes host memory: MPI_Alltoall, the same call
  // on every rank. MPICH's MPI_Alltoallv is 1.4-2.1x slower from 128 KiB at 2 ranks (it sends the
  // rank's own block to itself), Open MPI's ~1 us slower. Device pointers keep the MPI_Alltoallv
  // the GPU runs tested.
  if (uniform && hostEverywhere && localMax <= c.maxCount) {
    ++g_calls;
    const int count = static_cast<int>(sendCounts[0]);
    MPIGPU_MPI_CHECK(MPI_Alltoall(bytes(in), count, type, bytes(out), count, type, c.handle), op,
                     c.rank);
    return;
  }
  // Otherwise a rank holding host memory copies its own block itself (memcpy: copy_ costs ~2 us
  // more; both buffers are packed): it is still one MPI_Alltoallv on every rank.
  std::vector<int64_t> sc = sendCounts, rc = recvCounts;
  if (in.is_cpu() && out.is_cpu() && sc[c.rank] > 0) {
    const size_t es = in.element_size();
    std::memcpy(bytes(out) + recvDispl[c.rank] * es, bytes(in) + sendDispl[c.rank] * es,
                sc[c.rank] * es);
    sc[c.rank] = rc[c.rank] = 0;
  }
  alltoallvCall(c, op, type, in, sc, sendDispl, out, rc, recvDispl, localMax, uniform);
}

void barrier(const Comm& c, const char* op) {
  ++g_calls;
  barrierOn(c, op);
}

int testEach(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses, bool& done) {
  statuses.resize(requests.size());
  done = true;
  for (size_t k = 0; k < requests.size(); ++k) {
    if (requests[k] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    const int rc = MPI_Test(&requests[k], &flag, &statuses[k]);
    if (rc != MPI_SUCCESS) {
      statuses[k].MPI_ERROR = rc;
      return rc;
    }
    if (!flag) done = false;
  }
  return MPI_SUCCESS;
}

bool cancelRequests(std::vector<MPI_Request>& requests) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return true;
  for (auto& r : requests) {
    if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
  }
  // A cancelled receive completes at once; a matched one (or a send) may need a moment.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  bool done = false;
  std::vector<MPI_Status> statuses;
  while (true) {
    testEach(requests, statuses, done);  // (a request that fails here is complete too)
    if (done || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (done) return true;
  for (auto& r : requests) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  return false;
}

namespace {
// Posts one request per chunk; if posting chunk k fails, the requests already posted are
// cancelled before the error goes up (MPI would otherwise go on using the buffer).
template <typename PostOne>
std::vector<MPI_Request> postChunks(const at::Tensor& buf, int64_t maxCount, PostOne postOne) {
  std::vector<MPI_Request> reqs;
  auto post = [&](int64_t off, int n) {
    MPI_Request req = MPI_REQUEST_NULL;
    ++g_calls;
    postOne(off, n, &req);
    reqs.push_back(req);
  };
  try {
    if (buf.numel() == 0)
      post(0, 0);  // zero-byte messages still match a receive
    else
      forChunks(buf.numel(), maxCount, post);
  } catch (...) {
    if (!cancelRequests(reqs)) keepUntilExit(buf);
    throw;
  }
  return reqs;
}
}  // namespace

std::vector<MPI_Request> isend(const Comm& c, const char* op, const at::Tensor& buf, int dst,
                               int tag) {
  const MPI_Datatype type = transportType(buf.scalar_type(), op, c.rank);
  const int64_t es = buf.element_size();
  return postChunks(buf, c.maxCount, [&](int64_t off, int n, MPI_Request* req) {
    MPIGPU_MPI_CHECK(MPI_Isend(bytes(buf) + off * es, n, type, dst, tag, c.handle, req), op,
                     c.rank);
  });
}

std::vector<MPI_Request> irecv(const Comm& c, const char* op, at::Tensor& buf, int src, int tag) {
  const MPI_Datatype type = transportType(buf.scalar_type(), op, c.rank);
  if (src == MPI_ANY_SOURCE) checkAnySourceCount(c, op, buf);
  const int64_t es = buf.element_size();
  return postChunks(buf, c.maxCount, [&](int64_t off, int n, MPI_Request* req) {
    MPIGPU_MPI_CHECK(MPI_Irecv(bytes(buf) + off * es, n, type, src, tag, c.handle, req), op,
                     c.rank);
  });
}

void checkAnySourceCount(const Comm& c, const char* op, const at::Tensor& buf) {
  MPIGPU_CHECK_VALUE(buf.numel() <= c.maxCount, op, c.rank,
                     "receiving from any source is limited to ", c.maxCount,
                     " elements per message; receive from a named rank instead");
}

std::vector<MPI_Request> imrecv(const Comm& c, const char* op, at::Tensor& buf, MPI_Message* msg) {
  MPI_Request req;
  MPIGPU_MPI_CHECK(MPI_Imrecv(bytes(buf), static_cast<int>(buf.numel()),
                              transportType(buf.scalar_type(), op, c.rank), msg, &req),
                   op, c.rank);
  return {req};
}

}  // namespace mpigpu::mpi
