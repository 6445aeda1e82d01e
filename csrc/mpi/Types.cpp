#include "mpi/Types.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

#include "core/Errors.hpp"

namespace mpigpu::mpi {
namespace {

// MPI 3.1 has no 16-bit float type: fp16/bf16 travel as 2-byte contiguous types and are reduced by
// user-defined ops on the host, computing in float (as Horovod does).
MPI_Datatype g_half = MPI_DATATYPE_NULL;
MPI_Datatype g_bfloat16 = MPI_DATATYPE_NULL;
MPI_Datatype g_bytes16 = MPI_DATATYPE_NULL;
MPI_Op g_halfOps[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
MPI_Op g_bf16Ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
enum Arith { kSum = 0, kProd = 1, kMin = 2, kMax = 3 };

// Open MPI's op/avx component saturates 8- and 16-bit integer SUM (open-mpi/ompi#8045, "wontfix")
// while torch wraps; these ops wrap, as torch does. Index: [dtype][kSum or kProd].
enum Narrow { kI8 = 0, kU8 = 1, kI16 = 2, kU16 = 3 };
MPI_Op g_wrapOps[4][2] = {{MPI_OP_NULL, MPI_OP_NULL},
                          {MPI_OP_NULL, MPI_OP_NULL},
                          {MPI_OP_NULL, MPI_OP_NULL},
                          {MPI_OP_NULL, MPI_OP_NULL}};

template <typename T, Arith A>
void wrapInt(void* in, void* inout, int* len, MPI_Datatype*) {
  using U = std::make_unsigned_t<T>;  // unsigned arithmetic wraps without undefined behaviour
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const unsigned x = static_cast<U>(a[i]), y = static_cast<U>(b[i]);
    b[i] = static_cast<T>(static_cast<U>(A == kSum ? x + y : x * y));
  }
}

template <typename T>
void createWrapOps(MPI_Op* ops) {
  MPI_Op_create(&wrapInt<T, kSum>, 1, &ops[0]);
  MPI_Op_create(&wrapInt<T, kProd>, 1, &ops[1]);
}

int narrowIndex(at::ScalarType t) {
  switch (t) {
    case at::kChar: return kI8;
    case at::kByte: return kU8;
    case at::kShort: return kI16;
    case at::kUInt16: return kU16;
    default: return -1;
  }
}

template <typename T, Arith A>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    float r;
    if constexpr (A == kSum)
      r = x + y;
    else if constexpr (A == kProd)
      r = x * y;
    else if constexpr (A == kMin)
      r = (x < y || x != x) ? x : y;  // NaN propagates like torch
    else
      r = (x > y || x != x) ? x : y;
    b[i] = static_cast<T>(r);
  }
}

template <typename T>
void createOps(MPI_Op* ops) {
  MPI_Op_create(&reduce16<T, kSum>, 1, &ops[kSum]);
  MPI_Op_create(&reduce16<T, kProd>, 1, &ops[kProd]);
  MPI_Op_create(&reduce16<T, kMin>, 1, &ops[kMin]);
  MPI_Op_create(&reduce16<T, kMax>, 1, &ops[kMax]);
}

bool isIntegral(at::ScalarType t) { return at::isIntegralType(t, /*includeBool=*/false); }

MPI_Datatype arithmeticType(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kHalf: return g_half;
    case at::kBFloat16: return g_bfloat16;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kShort: return MPI_INT16_T;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kUInt16: return MPI_UINT16_T;
    case at::kUInt32: return MPI_UINT32_T;
    case at::kUInt64: return MPI_UINT64_T;
    case at::kBool: return MPI_C_BOOL;
    case at::kComplexFloat: return MPI_C_FLOAT_COMPLEX;
    case at::kComplexDouble: return MPI_C_DOUBLE_COMPLEX;
    default: return MPI_DATATYPE_NULL;
  }
}

[[noreturn]] void unsupported(c10d::ReduceOp::RedOpType kind, at::ScalarType dtype, const char* op,
                              int rank, const char* hint) {
  C10_THROW_ERROR(TypeError,
                  opMessage(op, rank, "ReduceOp.", reduceOpName(kind),
                            " is not supported for dtype ", c10::toString(dtype), "; ", hint));
}

}  // namespace

void registerCustomTypes() {
  MPI_Type_contiguous(2, MPI_BYTE, &g_half);
  MPI_Type_commit(&g_half);
  MPI_Type_contiguous(2, MPI_BYTE, &g_bfloat16);
  MPI_Type_commit(&g_bfloat16);
  MPI_Type_contiguous(2, MPI_UINT64_T, &g_bytes16);
  MPI_Type_commit(&g_bytes16);
  createOps<c10::Half>(g_halfOps);
  createOps<c10::BFloat16>(g_bf16Ops);
  createWrapOps<int8_t>(g_wrapOps[kI8]);
  createWrapOps<uint8_t>(g_wrapOps[kU8]);
  createWrapOps<int16_t>(g_wrapOps[kI16]);
  createWrapOps<uint16_t>(g_wrapOps[kU16]);
  // named, so MPI's own tools and messages show what they are
  MPI_Type_set_name(g_half, "mpigpu_float16");
  MPI_Type_set_name(g_bfloat16, "mpigpu_bfloat16");
  MPI_Type_set_name(g_bytes16, "mpigpu_bytes16");
}

void releaseCustomTypes() {
  for (MPI_Datatype* t : {&g_half, &g_bfloat16, &g_bytes16}) {
    if (*t != MPI_DATATYPE_NULL) MPI_Type_free(t);
  }
  for (MPI_Op* ops : {g_halfOps, g_bf16Ops}) {
    for (int i = 0; i < 4; ++i) {
      if (ops[i] != MPI_OP_NULL) MPI_Op_free(&ops[i]);
    }
  }
  for (auto& ops : g_wrapOps) {
    for (MPI_Op& op : ops) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  }
}

std::string typeName(MPI_Datatype type) {
  if (type == MPI_DATATYPE_NULL) return "MPI_DATATYPE_NULL";
  char name[MPI_MAX_OBJECT_NAME] = {0};
  int len = 0;
  MPI_Type_get_name(type, name, &len);
  return len > 0 ? std::string(name, len) : std::string("(unnamed datatype)");
}

std::string opName(MPI_Op op) {
  const std::pair<MPI_Op, const char*> predefined[] = {
      {MPI_SUM, "MPI_SUM"},   {MPI_PROD, "MPI_PROD"},      {MPI_MIN, "MPI_MIN"},
      {MPI_MAX, "MPI_MAX"},   {MPI_LAND, "MPI_LAND"},      {MPI_LOR, "MPI_LOR"},
      {MPI_LXOR, "MPI_LXOR"}, {MPI_BAND, "MPI_BAND"},      {MPI_BOR, "MPI_BOR"},
      {MPI_BXOR, "MPI_BXOR"}, {MPI_OP_NULL, "MPI_OP_NULL"}};
  for (const auto& [handle, name] : predefined) {
    if (op == handle) return name;
  }
  const char* arith[] = {"sum", "prod", "min", "max"};
  for (int i = 0; i < 4; ++i) {
    if (op == g_halfOps[i]) return c10::str("mpigpu_float16_", arith[i]);
    if (op == g_bf16Ops[i]) return c10::str("mpigpu_bfloat16_", arith[i]);
  }
  const char* narrow[] = {"int8", "uint8", "int16", "uint16"};
  for (int n = 0; n < 4; ++n) {
    for (int a = 0; a < 2; ++a) {
      if (op == g_wrapOps[n][a]) return c10::str("mpigpu_wrapping_", narrow[n], "_", arith[a]);
    }
  }
  return "(unknown op)";
}

const char* reduceOpName(c10d::ReduceOp::RedOpType kind) {
  switch (kind) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

MPI_Datatype transportType(at::ScalarType dtype, const char* op, int rank) {
  switch (c10::elementSize(dtype)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
    case 16: return g_bytes16;
    default:
      C10_THROW_ERROR(TypeError, opMessage(op, rank, "dtype ", c10::toString(dtype),
                                           " has an element size mpigpu cannot transport"));
  }
}

namespace {

[[noreturn]] void notReducible(c10d::ReduceOp::RedOpType kind, at::ScalarType dtype, const char* op,
                               int rank) {
  C10_THROW_ERROR(TypeError, opMessage(op, rank, "dtype ", c10::toString(dtype),
                                       " cannot be reduced (ReduceOp.", reduceOpName(kind),
                                       "); supported: float16, bfloat16, float32, float64, "
                                       "int8/16/32/64, uint8/16/32/64, bool, complex"));
}

// PREMUL_SUM's factor, a tensor (read on the device at reduction time) or a double.
void takePremulFactor(Reduction& r, const c10d::ReduceOp& reduceOp, at::ScalarType dtype,
                      const char* op, int rank) {
  if (!(at::isFloatingType(dtype) || at::isComplexType(dtype))) {
    unsupported(r.kind, dtype, op, rank, "PREMUL_SUM needs a floating-point dtype");
  }
  // NCCLPreMulSumSupplement: the name torch < 2.13 knows; later torch keeps it as an alias
  auto* supplement = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(reduceOp.supplement_.get());
  MPIGPU_CHECK_VALUE(supplement != nullptr, op, rank,
                     "PREMUL_SUM without a factor; create it with "
                     "torch.distributed._make_nccl_premul_sum(factor)");
  if (supplement->tensor_factor.defined()) {
    r.premulTensor = supplement->tensor_factor;
  } else {
    r.premulScalar = supplement->double_factor;
  }
}

// BAND/BOR/BXOR: logical ops on bool, bitwise ops on integers.
MPI_Op bitwiseOp(c10d::ReduceOp::RedOpType kind, bool boolean) {
  if (kind == c10d::ReduceOp::BAND) return boolean ? MPI_LAND : MPI_BAND;
  if (kind == c10d::ReduceOp::BOR) return boolean ? MPI_LOR : MPI_BOR;
  return boolean ? MPI_LXOR : MPI_BXOR;
}

}  // namespace

Reduction resolveReduction(const c10d::ReduceOp& reduceOp, at::ScalarType dtype, const char* op,
                           int rank) {
  Reduction r;
  r.kind = reduceOp.op_;
  r.type = arithmeticType(dtype);
  if (r.type == MPI_DATATYPE_NULL) notReducible(r.kind, dtype, op, rank);
  const bool floating = at::isFloatingType(dtype);
  const bool complex = at::isComplexType(dtype);
  const bool integral = isIntegral(dtype);
  const bool boolean = dtype == at::kBool;
  const bool is16 = dtype == at::kHalf || dtype == at::kBFloat16;
  MPI_Op* ops16 = dtype == at::kHalf ? g_halfOps : g_bf16Ops;
  const int narrow = narrowIndex(dtype);

  switch (r.kind) {
    case c10d::ReduceOp::SUM:
      r.op = boolean ? MPI_LOR : is16 ? ops16[kSum] : narrow >= 0 ? g_wrapOps[narrow][0] : MPI_SUM;
      break;
    case c10d::ReduceOp::AVG:
      if (!(floating || complex)) {
        unsupported(r.kind, dtype, op, rank,
                    "AVG is defined for floating-point and complex dtypes; for integers use SUM "
                    "and divide, or convert to float first");
      }
      r.op = is16 ? ops16[kSum] : MPI_SUM;
      r.divideBySize = true;
      break;
    case c10d::ReduceOp::PREMUL_SUM:
      r.op = is16 ? ops16[kSum] : MPI_SUM;
      takePremulFactor(r, reduceOp, dtype, op, rank);
      break;
    case c10d::ReduceOp::PRODUCT:
      if (complex) unsupported(r.kind, dtype, op, rank, "complex products are not supported");
      r.op = boolean       ? MPI_LAND
             : is16        ? ops16[kProd]
             : narrow >= 0 ? g_wrapOps[narrow][1]
                           : MPI_PROD;
      break;
    case c10d::ReduceOp::MIN:
      if (complex) unsupported(r.kind, dtype, op, rank, "complex numbers are not ordered");
      r.op = boolean ? MPI_LAND : is16 ? ops16[kMin] : MPI_MIN;
      break;
    case c10d::ReduceOp::MAX:
      if (complex) unsupported(r.kind, dtype, op, rank, "complex numbers are not ordered");
      r.op = boolean ? MPI_LOR : is16 ? ops16[kMax] : MPI_MAX;
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      if (!(integral || boolean)) {
        unsupported(r.kind, dtype, op, rank, "bitwise ops need an integer or bool dtype");
      }
      r.op = bitwiseOp(r.kind, boolean);
      break;
    default: unsupported(r.kind, dtype, op, rank, "unknown reduce op");
  }
  return r;
}

}  // namespace mpigpu::mpi
