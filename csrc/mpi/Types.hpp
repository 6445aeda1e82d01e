// Every dtype and reduce-op mapping lives here. An unsupported (op, dtype) pair is a TypeError
// that names both, the op and the rank.
#pragma once

#include <mpi.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <string>

namespace mpigpu::mpi {

// How a reduction is done: an MPI type and op, plus the steps around the MPI call that MPI has no
// op for (AVG divides by the group size afterwards; PREMUL_SUM scales inputs first).
struct Reduction {
  c10d::ReduceOp::RedOpType kind = c10d::ReduceOp::SUM;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  bool divideBySize = false;
  std::optional<double> premulScalar;
  at::Tensor premulTensor;  // one element, any device
  bool needsPrescale() const { return premulScalar.has_value() || premulTensor.defined(); }
};

// Datatype for moving bytes without arithmetic (broadcast, gather, alltoall, p2p): an unsigned
// type of the element's width, so any dtype (complex, float8, ...) can travel.
MPI_Datatype transportType(at::ScalarType dtype, const char* op, int rank);

Reduction resolveReduction(const c10d::ReduceOp& reduceOp, at::ScalarType dtype, const char* op,
                           int rank);

const char* reduceOpName(c10d::ReduceOp::RedOpType kind);

// Names for messages and unit tests: MPI's own for predefined handles, mpigpu_* for ours.
std::string typeName(MPI_Datatype type);
std::string opName(MPI_Op op);

// Created after MPI_Init (user-defined fp16/bf16 ops, 16-byte transport type), freed before
// MPI_Finalize.
void registerCustomTypes();
void releaseCustomTypes();

}  // namespace mpigpu::mpi
