#include "Config.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <climits>
#include <cstdlib>
#include <string>

namespace mpigpu {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int64_t parseInt(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi) {
    C10_THROW_ERROR(ValueError, c10::str("mpigpu: ", name, "=", v, " is not an integer in [", lo,
                                         ", ", hi, "]; unset it or give a valid value"));
  }
  return x;
}

} // namespace

Config Config::fromEnv() {
  Config c;
  c.maxElementsPerCall = parseInt("TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL", INT_MAX, 1, INT_MAX);
  c.debug = parseInt("TORCH_MPIGPU_DEBUG", 0, 0, 2) != 0;
  c.stagingChunkBytes = parseInt("TORCH_MPIGPU_STAGING_CHUNK_BYTES", c.stagingChunkBytes, 1,
                                 int64_t{1} << 40);
  c.fusionBytes = parseInt("TORCH_MPIGPU_FUSION_BYTES", c.fusionBytes, 0, int64_t{1} << 40);
  c.inlineBytes = parseInt("TORCH_MPIGPU_INLINE_BYTES", c.inlineBytes, 0, int64_t{1} << 40);
  c.fuseBelowBytes = parseInt("TORCH_MPIGPU_FUSE_BELOW_BYTES", c.fuseBelowBytes, 0,
                              int64_t{1} << 40);
  if (const char* a = env("TORCH_MPIGPU_TIMEOUT_ACTION")) {
    const std::string v = a;
    if (v != "abort" && v != "report") {
      C10_THROW_ERROR(ValueError, c10::str("mpigpu: TORCH_MPIGPU_TIMEOUT_ACTION=", a,
                                           " must be abort or report"));
    }
    c.abortOnTimeout = v == "abort";
  }
  if (const char* a = env("TORCH_MPIGPU_CUDA_AWARE")) {
    const std::string v = a;
    if (v == "auto") c.cudaAware = -1;
    else if (v == "1") c.cudaAware = 1;
    else if (v == "0") c.cudaAware = 0;
    else C10_THROW_ERROR(ValueError, c10::str("mpigpu: TORCH_MPIGPU_CUDA_AWARE=", a,
                                              " must be auto, 1 or 0"));
  }
  if (const char* a = env("TORCH_MPIGPU_CUDA_REDUCE")) {
    const std::string v = a;
    if (v == "auto") c.cudaReduce = -1;
    else if (v == "direct") c.cudaReduce = 1;
    else if (v == "staged") c.cudaReduce = 0;
    else C10_THROW_ERROR(ValueError, c10::str("mpigpu: TORCH_MPIGPU_CUDA_REDUCE=", a,
                                              " must be auto, direct or staged"));
  }
  if (const char* t = env("TORCH_MPIGPU_TIMEOUT")) {
    char* end = nullptr;
    c.timeoutSeconds = std::strtod(t, &end);
    if (end == t || *end != '\0' || c.timeoutSeconds <= 0) {
      C10_THROW_ERROR(ValueError, c10::str("mpigpu: TORCH_MPIGPU_TIMEOUT=", t,
                                           " is not a positive number of seconds"));
    }
  }
  return c;
}

} // namespace mpigpu
