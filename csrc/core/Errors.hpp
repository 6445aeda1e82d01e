// Error helpers: every message names the backend, the op and the rank, then says what to do.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace mpigpu {

// Prefix used by every error and log line: "mpigpu allreduce [rank 3]: ".
template <typename... Args>
std::string opMessage(const char* op, int rank, const Args&... args) {
  return c10::str("mpigpu ", op, " [rank ", rank, "]: ", args...);
}

}  // namespace mpigpu

// Bad argument values -> Python ValueError.
#define MPIGPU_CHECK_VALUE(cond, op, rank, ...)                                \
  do {                                                                         \
    if (C10_UNLIKELY(!(cond))) {                                               \
      C10_THROW_ERROR(ValueError, ::mpigpu::opMessage(op, rank, __VA_ARGS__)); \
    }                                                                          \
  } while (0)

// Bad argument kinds (dtype, layout, device, unsupported combination) -> Python TypeError.
#define MPIGPU_CHECK_TYPE(cond, op, rank, ...)                                \
  do {                                                                        \
    if (C10_UNLIKELY(!(cond))) {                                              \
      C10_THROW_ERROR(TypeError, ::mpigpu::opMessage(op, rank, __VA_ARGS__)); \
    }                                                                         \
  } while (0)

// Communication failures -> torch.distributed.DistBackendError.
#define MPIGPU_THROW_BACKEND(op, rank, ...) \
  C10_THROW_ERROR(DistBackendError, ::mpigpu::opMessage(op, rank, __VA_ARGS__))
