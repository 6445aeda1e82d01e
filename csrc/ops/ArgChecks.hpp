// Argument checks, on the caller's thread before anything is queued: a ValueError or TypeError
// naming the op and the rank, the same on every rank, and the group keeps working.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace mpigpu {

void checkTensor(const char* op, int rank, const at::Tensor& t);
// `t` passes checkTensor and is on ref's device (`what` names it in the message).
void checkSameDevice(const char* op, int rank, const at::Tensor& ref, const at::Tensor& t,
                     const char* what);
// ... and has ref's dtype.
void checkSameKind(const char* op, int rank, const at::Tensor& ref, const at::Tensor& t,
                   const char* what);
// Exactly one tensor, which passes checkTensor.
void checkSingle(const char* op, int rank, const std::vector<at::Tensor>& ts);
// 0 <= peer < size (`what`: "root", "peer", ...).
void checkRank(const char* op, int rank, int size, int64_t peer, const char* what);

}  // namespace mpigpu
