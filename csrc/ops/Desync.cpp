#include "ops/Desync.hpp"

#include <algorithm>
#include <sstream>

#include "core/Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu {

Fingerprint fingerprintOf(c10d::OpType type, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, int root) {
  Fingerprint fp{static_cast<int64_t>(type), -1, -1, root};
  // What every rank holds alike: a scatter's and an all_gather's outputs (all_gather inputs may
  // differ in size between ranks), the inputs otherwise.
  const bool byOutputs =
      type == c10d::OpType::SCATTER || type == c10d::OpType::ALLGATHER || inputs.empty();
  const auto& described = byOutputs ? outputs : inputs;
  if (!described.empty()) fp.dtype = static_cast<int64_t>(described[0].scalar_type());
  if (type != c10d::OpType::ALLTOALL && type != c10d::OpType::ALLTOALL_BASE) {
    fp.numel = 0;
    for (const auto& t : described) fp.numel += t.numel();
  }
  return fp;
}

void checkSameCollective(const mpi::Comm& comm, const std::string& group, const char* op,
                         uint64_t seq, const Fingerprint& mine) {
  const int rank = comm.rank, size = comm.size;
  // One small allgather: every rank issues it before the op, so it matches even when the ops
  // do not, and every rank sees the same table and raises the same error.
  std::vector<Fingerprint> all(size);
  static_assert(sizeof(Fingerprint) == 4 * sizeof(int64_t), "Fingerprint must be 4 int64");
  mpi::arriveTogether(comm, op);
  MPIGPU_MPI_CHECK(MPI_Allgather(&mine, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, comm.handle),
                   op, rank);
  auto same = [&](const Fingerprint& f) {
    return f.type == all[0].type && f.dtype == all[0].dtype && f.numel == all[0].numel &&
           f.root == all[0].root;
  };
  if (std::all_of(all.begin(), all.end(), same)) return;
  std::ostringstream table;
  for (int r = 0; r < size; ++r) {
    const auto& f = all[r];
    table << "\n  rank " << r << ": " << c10d::opTypeToString(static_cast<c10d::OpType>(f.type));
    if (f.dtype >= 0) table << " " << static_cast<at::ScalarType>(f.dtype);
    if (f.numel >= 0) table << ", " << f.numel << " elements";
    if (f.root >= 0) table << ", root " << f.root;
    if (!same(f)) table << "   <- differs from rank 0";
  }
  MPIGPU_THROW_BACKEND(
      op, rank, "collective #", seq, ": the ranks of group '", group,
      "' are not issuing the same collective (TORCH_MPIGPU_DESYNC_CHECK=1):", table.str(),
      "\nEvery rank must call the same collectives in the same "
      "order with matching dtype, size and root. The op was not run.");
}

}  // namespace mpigpu
