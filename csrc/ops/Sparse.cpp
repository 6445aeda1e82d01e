#include "ops/Sparse.hpp"

#include <ATen/core/LegacyTypeDispatch.h>

#include <algorithm>
#include <sstream>

#include "core/Errors.hpp"
#include "mpi/Types.hpp"

namespace mpigpu::sparse {
namespace {

constexpr int64_t kMaxDims = 12;
// What a rank tells the others first: how much it sends, and what it holds, so that every rank
// can check that all passed one size and dtype (the same table on every rank: all raise alike).
struct Record {
  int64_t dtype, sparseDim, ndim, nnz;
  int64_t sizes[kMaxDims];
};
constexpr int64_t kRecordLen = sizeof(Record) / sizeof(int64_t);

Record recordOf(const at::Tensor& t) {
  Record r{static_cast<int64_t>(t.scalar_type()), t.sparse_dim(), t.dim(), t._nnz(), {}};
  for (int64_t d = 0; d < t.dim(); ++d) r.sizes[d] = t.size(d);
  return r;
}

std::string describe(const Record& r) {
  std::ostringstream s;
  s << "size [";
  for (int64_t d = 0; d < r.ndim; ++d) s << (d ? ", " : "") << r.sizes[d];
  s << "] with " << r.sparseDim << " sparse dim(s), dtype " << static_cast<at::ScalarType>(r.dtype);
  return s.str();
}

std::vector<Record> gatherRecords(const mpi::Comm& comm, const char* op, const at::Tensor& t) {
  std::vector<Record> all(static_cast<size_t>(comm.size));
  Record mine = recordOf(t);
  at::Tensor in = at::from_blob(&mine, {kRecordLen}, at::kLong);
  at::Tensor out = at::from_blob(all.data(), {comm.size * kRecordLen}, at::kLong);
  mpi::allgather(comm, op, in, out);
  for (int p = 0; p < comm.size; ++p) {
    const Record& r = all[static_cast<size_t>(p)];
    const bool same = r.dtype == mine.dtype && r.sparseDim == mine.sparseDim &&
                      r.ndim == mine.ndim && std::equal(r.sizes, r.sizes + kMaxDims, mine.sizes);
    MPIGPU_CHECK_VALUE(same, op, comm.rank, "sparse tensors differ between ranks: rank ", comm.rank,
                       " has ", describe(mine), ", rank ", p, " has ", describe(r),
                       "; every rank must pass a tensor of one size and dtype");
  }
  return all;
}

// Every rank's rows, in rank order: indices as [nnz, sparseDim] (so the blocks stack), values as
// [nnz, dense sizes...].
std::pair<at::Tensor, at::Tensor> gatherEntries(const mpi::Comm& comm, const char* op,
                                                const at::Tensor& t,
                                                const std::vector<Record>& all) {
  const int64_t sparseDim = t.sparse_dim();
  const int64_t denseNumel = c10::multiply_integers(t.sizes().slice(sparseDim));
  std::vector<int64_t> indexCounts, valueCounts;
  int64_t total = 0;
  for (const Record& r : all) {
    indexCounts.push_back(r.nnz * sparseDim);
    valueCounts.push_back(r.nnz * denseNumel);
    total += r.nnz;
  }
  at::Tensor myIndices = t._indices().t().contiguous();
  at::Tensor myValues = t._values().contiguous();
  at::Tensor indices = at::empty({total, sparseDim}, myIndices.options());
  std::vector<int64_t> valueShape{total};
  for (int64_t d = sparseDim; d < t.dim(); ++d) valueShape.push_back(t.size(d));
  at::Tensor values = at::empty(valueShape, myValues.options());
  at::Tensor flatIndices = indices.view({-1}), flatValues = values.view({-1});
  mpi::allgatherv(comm, op, myIndices.view({-1}), flatIndices, indexCounts);
  mpi::allgatherv(comm, op, myValues.view({-1}), flatValues, valueCounts);
  return {indices.t().contiguous(), values};
}

}  // namespace

void checkAllreduce(const char* op, int rank, const std::vector<at::Tensor>& tensors,
                    const c10d::ReduceOp& reduceOp) {
  MPIGPU_CHECK_VALUE(!tensors.empty(), op, rank, "got an empty tensor list");
  const at::Tensor& first = tensors[0];
  for (const auto& t : tensors) {
    MPIGPU_CHECK_VALUE(t.defined(), op, rank, "got an undefined tensor");
    MPIGPU_CHECK_TYPE(t.layout() == at::kSparse, op, rank,
                      "the list mixes sparse COO and other layouts (", t.layout(),
                      "); pass sparse and dense tensors in separate calls");
    MPIGPU_CHECK_TYPE(t.device() == first.device() && t.scalar_type() == first.scalar_type(), op,
                      rank, "all tensors of one call must share a device and dtype, got ",
                      first.device(), "/", first.scalar_type(), " and ", t.device(), "/",
                      t.scalar_type());
    MPIGPU_CHECK_TYPE(t.dim() <= kMaxDims, op, rank, "sparse tensors of more than ", kMaxDims,
                      " dimensions are not supported, got ", t.dim());
  }
  const auto kind = reduceOp.op_;
  const at::ScalarType dtype = first.scalar_type();
  MPIGPU_CHECK_TYPE(kind == c10d::ReduceOp::SUM || kind == c10d::ReduceOp::AVG, op, rank,
                    "sparse tensors are reduced by SUM or AVG only (the entries a rank does not "
                    "hold are zeros), got ReduceOp.",
                    mpi::reduceOpName(kind), "; call .to_dense() first for other reductions");
  MPIGPU_CHECK_TYPE(dtype != at::kBool, op, rank,
                    "sparse bool tensors cannot be summed (torch has no sparse bool add); use "
                    "uint8 or .to_dense()");
  MPIGPU_CHECK_TYPE(
      kind != c10d::ReduceOp::AVG || at::isFloatingType(dtype) || at::isComplexType(dtype), op,
      rank, "ReduceOp.AVG needs a floating-point dtype, got ", dtype, "; use SUM and divide");
  mpi::transportType(dtype, op, rank);
}

void allreduceInPlace(const mpi::Comm& comm, const char* op, at::Tensor& t, bool average) {
  // Plain tensor arithmetic below, as in gloo: the caller's tensor may be a leaf that requires
  // grad, and nothing here is part of its graph.
  at::AutoDispatchBelowAutograd belowAutograd;
  // Ordered after the caller's stream: this runs on the op's stream, and the copy to the host
  // waits for it.
  const at::Tensor local = t.coalesce().to(at::kCPU);
  const std::vector<Record> all = gatherRecords(comm, op, local);
  auto [indices, values] = gatherEntries(comm, op, local, all);
  // The same entries in the same order on every rank, summed by the same host code: the same
  // bits everywhere.
  at::Tensor sum =
      at::_sparse_coo_tensor_unsafe(indices, values, local.sizes(), local.options()).coalesce();
  if (average) sum._values().div_(comm.size);
  t.copy_(sum.to(t.device()));
}

}  // namespace mpigpu::sparse
