#include "Config.hpp"

#include "algorithms/Algorithms.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

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

// One of a fixed set of words: the value paired with the word given, `fallback` when unset;
// anything else is a ValueError listing the words.
template <typename T>
T parseChoice(const char* name, T fallback,
              std::initializer_list<std::pair<const char*, T>> choices) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  std::string words;
  for (const auto& [word, value] : choices) {
    if (std::string(v) == word) return value;
    words += words.empty() ? word : std::string(", ") + word;
  }
  C10_THROW_ERROR(ValueError, c10::str("mpigpu: ", name, "=", v, " must be one of: ", words));
}

} // namespace

Config Config::fromEnv() {
  Config c;
  c.maxElementsPerCall = parseInt("TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL", INT_MAX, 1, INT_MAX);
  c.debug = parseInt("TORCH_MPIGPU_DEBUG", 0, 0, 1) != 0;
  c.desyncCheck = parseInt("TORCH_MPIGPU_DESYNC_CHECK", 0, 0, 1) != 0;
  c.stagingChunkBytes = parseInt("TORCH_MPIGPU_STAGING_CHUNK_BYTES", c.stagingChunkBytes, 1,
                                 int64_t{1} << 40);
  c.fusionBytes = parseInt("TORCH_MPIGPU_FUSION_BYTES", c.fusionBytes, 0, int64_t{1} << 40);
  c.inlineBytes = parseInt("TORCH_MPIGPU_INLINE_BYTES", c.inlineBytes, 0, int64_t{1} << 40);
  c.fuseBelowBytes = parseInt("TORCH_MPIGPU_FUSE_BELOW_BYTES", c.fuseBelowBytes, 0,
                              int64_t{1} << 40);
  c.abortOnTimeout = parseChoice("TORCH_MPIGPU_TIMEOUT_ACTION", true,
                                 {{"abort", true}, {"report", false}});
  c.cudaAware = parseChoice("TORCH_MPIGPU_CUDA_AWARE", CudaAware::Auto,
                            {{"auto", CudaAware::Auto}, {"1", CudaAware::DevicePointers},
                             {"0", CudaAware::Staged}});
  c.cudaReduce = parseChoice("TORCH_MPIGPU_CUDA_REDUCE", CudaReduce::Auto,
                             {{"auto", CudaReduce::Auto}, {"direct", CudaReduce::Direct},
                              {"staged", CudaReduce::Staged}});
  using algo::Algo;
  c.algo = parseChoice<std::optional<Algo>>(
      "TORCH_MPIGPU_ALGO", std::nullopt,
      {{"auto", std::nullopt}, {"mpi", Algo::Mpi}, {"ring", Algo::Ring}, {"rhd", Algo::Rhd},
       {"allgather", Algo::Allgather}});
  c.algoPieceBytes = parseInt("TORCH_MPIGPU_ALGO_PIECE_BYTES", c.algoPieceBytes, 1,
                              int64_t{1} << 40);
  c.algoMinBytes = parseInt("TORCH_MPIGPU_ALGO_MIN_BYTES", c.algoMinBytes, 0, int64_t{1} << 62);
  c.hostHalfRingBytes = parseInt("TORCH_MPIGPU_HOST_HALF_RING_BYTES", c.hostHalfRingBytes, 0,
                                 int64_t{1} << 62);
  c.hostReduceScatterRingBytes = parseInt("TORCH_MPIGPU_HOST_RS_RING_BYTES",
                                          c.hostReduceScatterRingBytes, 0, int64_t{1} << 62);
  c.cudaDirectBytes = parseInt("TORCH_MPIGPU_CUDA_DIRECT_BYTES", c.cudaDirectBytes, 0,
                               int64_t{1} << 62);
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
