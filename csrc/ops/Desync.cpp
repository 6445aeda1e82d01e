#include "ops/Desync.hpp"

#include <algorithm>
#include <sstream>

#include "core/Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Types.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu {

namespace {

constexpr int kFields = 5;  // a Fingerprint, as MPI_INT64_T
static_assert(sizeof(Fingerprint) == kFields * sizeof(int64_t), "Fingerprint: 5 int64");

// What a check exchanges: this op's fingerprint, the digest of the ops since the last check, and
// how many those are (the same on every rank: collectives are numbered alike).
struct Wire {
  Fingerprint fp;
  int64_t digest, since, count;
};
constexpr int kWire = kFields + 3;
static_assert(sizeof(Wire) == kWire * sizeof(int64_t), "Wire: 8 int64");

uint64_t fold(uint64_t digest, const Fingerprint& fp) {
  // FNV-1a's step a field at a time, each product's high bits folded back down so every bit of
  // a field reaches the whole digest: order-sensitive, a few nanoseconds per op
  uint64_t h = digest == 0 ? 1469598103934665603ULL : digest;
  for (const int64_t field : {fp.type, fp.dtype, fp.numel, fp.root, fp.redop}) {
    h = (h ^ static_cast<uint64_t>(field)) * 1099511628211ULL;
    h ^= h >> 32;
  }
  return h;
}

std::string describe(const Fingerprint& f) {
  std::ostringstream s;
  s << c10d::opTypeToString(static_cast<c10d::OpType>(f.type));
  if (f.dtype >= 0) s << " " << static_cast<at::ScalarType>(f.dtype);
  if (f.numel >= 0) s << ", " << f.numel << " elements";
  if (f.root >= 0) s << ", root " << f.root;
  if (f.redop >= 0) s << ", " << mpi::reduceOpName(static_cast<c10d::ReduceOp::RedOpType>(f.redop));
  return s.str();
}

// Each rank's call, the ones unlike rank 0's marked; empty where every rank agrees.
std::string tableOf(const std::vector<Fingerprint>& all) {
  if (std::all_of(all.begin(), all.end(), [&](const Fingerprint& f) { return f == all[0]; }))
    return "";
  std::ostringstream table;
  for (size_t r = 0; r < all.size(); ++r) {
    table << "\n  rank " << r << ": " << describe(all[r]);
    if (!(all[r] == all[0])) table << "   <- differs from rank 0";
  }
  return table.str();
}

constexpr const char* kFix =
    "\nEvery rank must call the same collectives in the same order with matching dtype, size, "
    "root and reduce op.";

}  // namespace

Fingerprint fingerprintOf(c10d::OpType type, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, int root, int redop) {
  Fingerprint fp{static_cast<int64_t>(type), -1, -1, root, redop};
  // What every rank holds alike: a scatter's and an all_gather's outputs (all_gather inputs may
  // differ in size between ranks), the inputs otherwise.
  const bool byOutputs =
      type == c10d::OpType::SCATTER || type == c10d::OpType::ALLGATHER || inputs.empty();
  const auto& described = byOutputs ? outputs : inputs;
  if (!described.empty()) fp.dtype = static_cast<int64_t>(described[0].scalar_type());
  // all_to_all's splits may differ between ranks; a sparse all_reduce compares its sizes itself
  // (every rank raises the same ValueError where they differ: ops/Sparse.cpp)
  const bool sparse = !described.empty() && described[0].is_sparse();
  if (type != c10d::OpType::ALLTOALL && type != c10d::OpType::ALLTOALL_BASE && !sparse) {
    fp.numel = 0;
    for (const auto& t : described) fp.numel += t.numel();
  }
  return fp;
}

bool DesyncCheck::due(uint64_t seq) const {
  if (mode_ == DesyncMode::Every) return true;
  return static_cast<int64_t>(seq) <= firstOps_ || seq % static_cast<uint64_t>(interval_) == 0;
}

void DesyncCheck::reset(uint64_t nextSeq) {
  digest_ = 0;
  since_ = nextSeq;
  recent_.clear();
}

void DesyncCheck::onCollective(const mpi::Comm& comm, const std::string& group, const char* op,
                               uint64_t seq, const Fingerprint& fp) {
  if (mode_ == DesyncMode::Off) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!due(seq)) {
    digest_ = fold(digest_, fp);
    recent_.push_back(fp);
    return;
  }
  // One small allgather: every rank issues it before the op, so it matches even when the ops
  // do not, and every rank sees the same table and raises the same error.
  const Wire mine{fp, static_cast<int64_t>(digest_), static_cast<int64_t>(since_),
                  static_cast<int64_t>(recent_.size())};
  std::vector<Wire> all(comm.size);
  mpi::arriveTogether(comm, op);
  MPIGPU_MPI_CHECK(
      MPI_Allgather(&mine, kWire, MPI_INT64_T, all.data(), kWire, MPI_INT64_T, comm.handle), op,
      comm.rank);
  std::vector<Fingerprint> now;
  for (const auto& w : all) now.push_back(w.fp);
  const bool countsDiffer = std::any_of(all.begin(), all.end(), [&](const Wire& w) {
    return w.count != all[0].count || w.since != all[0].since;
  });
  if (countsDiffer) {
    reset(seq + 1);
    MPIGPU_THROW_BACKEND(op, comm.rank, "collective #", seq, ": the ranks of group '", group,
                         "' numbered their collectives differently since the last check (a rank "
                         "issued one the others did not)",
                         kFix);
  }
  const bool earlierDiffer =
      std::any_of(all.begin(), all.end(), [&](const Wire& w) { return w.digest != all[0].digest; });
  if (earlierDiffer) reportEarlier(comm, group, op, seq);
  reset(seq + 1);
  const std::string table = tableOf(now);
  if (table.empty()) return;
  MPIGPU_THROW_BACKEND(op, comm.rank, "collective #", seq, ": the ranks of group '", group,
                       "' are not issuing the same collective:", table, kFix,
                       " The op was not run.");
}

void DesyncCheck::reportEarlier(const mpi::Comm& comm, const std::string& group, const char* op,
                                uint64_t seq) {
  // Every rank holds the same number of fingerprints (the digests cover the same collectives):
  // gather them all and name the first collective on which the ranks differed.
  const int count = static_cast<int>(recent_.size());
  std::vector<Fingerprint> all(static_cast<size_t>(count) * comm.size);
  MPIGPU_MPI_CHECK(MPI_Allgather(recent_.data(), count * kFields, MPI_INT64_T, all.data(),
                                 count * kFields, MPI_INT64_T, comm.handle),
                   op, comm.rank);
  const uint64_t first = since_;
  reset(seq + 1);  // this op is not run; the group goes on from the next
  for (int i = 0; i < count; ++i) {
    std::vector<Fingerprint> ranks;
    for (int r = 0; r < comm.size; ++r) ranks.push_back(all[static_cast<size_t>(r) * count + i]);
    const std::string table = tableOf(ranks);
    if (table.empty()) continue;
    MPIGPU_THROW_BACKEND(op, comm.rank, "collective #", seq, ": the ranks of group '", group,
                         "' did not issue the same collective #", first + i,
                         " (found by the desync check at this collective; #", first + i,
                         " ran with mismatched arguments, so its results and those of the "
                         "collectives after it may be wrong):",
                         table, kFix, " This op was not run.");
  }
  MPIGPU_THROW_BACKEND(op, comm.rank, "collective #", seq, ": the ranks of group '", group,
                       "' issued different collectives since #", first,
                       " (their digests differ) but their recorded calls agree", kFix);
}

}  // namespace mpigpu
