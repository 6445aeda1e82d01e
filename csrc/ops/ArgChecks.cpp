#include "ops/ArgChecks.hpp"

#include "core/Errors.hpp"

namespace mpigpu {

void checkTensor(const char* op, int rank, const at::Tensor& t) {
  MPIGPU_CHECK_VALUE(t.defined(), op, rank, "got an undefined tensor");
  MPIGPU_CHECK_TYPE(t.layout() == at::kStrided, op, rank,
                    "only dense (strided) tensors are "
                    "supported, got layout ",
                    t.layout(), "; call .to_dense() first");
  MPIGPU_CHECK_TYPE(!t.is_meta(), op, rank, "meta tensors have no data to communicate");
  MPIGPU_CHECK_TYPE(!t.is_quantized(), op, rank,
                    "quantized tensors are not supported; "
                    "communicate t.int_repr() and the scale/zero point instead");
}

void checkSameDevice(const char* op, int rank, const at::Tensor& ref, const at::Tensor& t,
                     const char* what) {
  checkTensor(op, rank, t);
  MPIGPU_CHECK_TYPE(t.device() == ref.device(), op, rank, what, " is on ", t.device(),
                    " but the first tensor is on ", ref.device(),
                    "; all tensors of one call must be on one device");
}

void checkSameKind(const char* op, int rank, const at::Tensor& ref, const at::Tensor& t,
                   const char* what) {
  checkSameDevice(op, rank, ref, t, what);
  MPIGPU_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, rank, what, " has dtype ",
                    t.scalar_type(), " but the first tensor has ", ref.scalar_type(),
                    "; all tensors of one call must share a dtype");
}

void checkSingle(const char* op, int rank, const std::vector<at::Tensor>& ts) {
  MPIGPU_CHECK_VALUE(ts.size() == 1, op, rank, "expects exactly one tensor per call, got ",
                     ts.size(), " (one tensor per process; use a list op for several)");
  checkTensor(op, rank, ts[0]);
}

void checkRank(const char* op, int rank, int size, int64_t peer, const char* what) {
  MPIGPU_CHECK_VALUE(peer >= 0 && peer < size, op, rank, what, " ", peer,
                     " is out of range for a group of ", size, " ranks");
}

}  // namespace mpigpu
