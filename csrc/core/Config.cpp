#include "core/Config.hpp"

#include "core/Settings.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

namespace mpigpu {
namespace {

// The variable's value, else the table's default; nullptr when neither gives one.
const char* valueOf(const char* name) {
  const char* v = std::getenv(name);
  if (v != nullptr && *v != '\0') return v;
  const char* fallback = setting(name).defaultValue;
  return *fallback != '\0' ? fallback : nullptr;
}

// valueOf for settings that always have a value (their table row gives a default).
const char* requiredValueOf(const char* name) {
  const char* v = valueOf(name);
  TORCH_INTERNAL_ASSERT(v != nullptr, "mpigpu: ", name,
                        " has no default in csrc/core/Settings.cpp");
  return v;
}

int64_t parseInt(const char* name, int64_t lo, int64_t hi) {
  const char* v = requiredValueOf(name);
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi) {
    C10_THROW_ERROR(ValueError, c10::str("mpigpu: ", name, "=", v, " is not an integer in [", lo,
                                         ", ", hi, "]; unset it or give a valid value"));
  }
  return x;
}

bool parseFlag(const char* name) { return parseInt(name, 0, 1) != 0; }

// One of a fixed set of words: the value paired with the word given (or the table's default);
// anything else is a ValueError listing the words.
template <typename T>
T parseChoice(const char* name, std::initializer_list<std::pair<const char*, T>> choices) {
  const char* v = requiredValueOf(name);
  std::string words;
  for (const auto& [word, value] : choices) {
    if (std::string(v) == word) return value;
    words += words.empty() ? word : std::string(", ") + word;
  }
  C10_THROW_ERROR(ValueError, c10::str("mpigpu: ", name, "=", v, " must be one of: ", words));
}

double parseTimeoutSeconds(const char* name) {
  const char* v = valueOf(name);
  if (v == nullptr) return 0;  // unset: the group's own timeout
  char* end = nullptr;
  double seconds = std::strtod(v, &end);
  if (end == v || *end != '\0' || seconds <= 0) {
    C10_THROW_ERROR(ValueError,
                    c10::str("mpigpu: ", name, "=", v, " is not a positive number of seconds"));
  }
  return seconds;
}

constexpr int64_t kTiB = int64_t{1} << 40;
constexpr int64_t kHuge = int64_t{1} << 62;

// The node algorithm's settings (a part of fromEnv).
void readNodeSettings(Config& c) {
  c.nodeBufferBytes = parseInt("TORCH_MPIGPU_NODE_BUFFER_BYTES", 0, kTiB);
  c.nodeOneShotBytes = parseInt("TORCH_MPIGPU_NODE_ONE_SHOT_BYTES", 0, kHuge);
  c.nodeSingleCopyBytes = parseInt("TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES", 0, kHuge);
  c.testNoSingleCopy = parseFlag("TORCH_MPIGPU_TEST_NO_SINGLE_COPY");
  c.nodeDeviceBufferBytes = parseInt("TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES", 1, kTiB);
  c.nodeDeviceBufferMaxBytes = parseInt("TORCH_MPIGPU_NODE_DEVICE_BUFFER_MAX_BYTES", 1, kTiB);
  c.nodeTestDeviceSlots = parseFlag("TORCH_MPIGPU_TEST_DEVICE_SLOTS");
  c.nodeDeviceOrder = parseChoice<NodeDeviceOrder>("TORCH_MPIGPU_NODE_DEVICE_ORDER",
                                                   {{"auto", NodeDeviceOrder::Auto},
                                                    {"host", NodeDeviceOrder::Host},
                                                    {"device", NodeDeviceOrder::Device}});
  c.nodeLeader = parseChoice<NodeLeader>(
      "TORCH_MPIGPU_NODE_LEADER",
      {{"auto", NodeLeader::Auto}, {"1", NodeLeader::On}, {"0", NodeLeader::Off}});
  c.testHostPieceBytes = parseInt("TORCH_MPIGPU_TEST_HOST_PIECE_BYTES", 0, kTiB);
  c.nodeAcrossMinBytes = parseInt("TORCH_MPIGPU_NODE_ACROSS_MIN_BYTES", 0, kHuge);
  c.nodeHostMpiFromBytes = parseInt("TORCH_MPIGPU_NODE_HOST_MPI_FROM_BYTES", 0, kHuge);
  c.nodeHostMpiCrowdedFromBytes =
      parseInt("TORCH_MPIGPU_NODE_HOST_MPI_CROWDED_FROM_BYTES", 0, kHuge);
  c.nodeHostMpiBelowBytes = parseInt("TORCH_MPIGPU_NODE_HOST_MPI_BELOW_BYTES", 0, kHuge);
  c.nodeHostMpiCrowdedBelowBytes =
      parseInt("TORCH_MPIGPU_NODE_HOST_MPI_CROWDED_BELOW_BYTES", 0, kHuge);
  c.nodeSharedGpuAllreduceBytes =
      parseInt("TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES", 0, kHuge);
  c.pretendNodes = static_cast<int>(parseInt("TORCH_MPIGPU_TEST_PRETEND_NODES", 1, 1 << 20));
}

}  // namespace

Config Config::fromEnv() {
  Config c;
  c.sharedSettings = mpigpu::sharedSettings();
  c.maxElementsPerCall = parseInt("TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL", 1, INT_MAX);
  c.debug = parseFlag("TORCH_MPIGPU_DEBUG");
  c.desyncCheck = parseChoice<DesyncMode>(
      "TORCH_MPIGPU_DESYNC_CHECK",
      {{"0", DesyncMode::Off}, {"auto", DesyncMode::Sampled}, {"1", DesyncMode::Every}});
  c.desyncFirstOps = parseInt("TORCH_MPIGPU_DESYNC_CHECK_FIRST_OPS", 0, kHuge);
  c.desyncInterval = parseInt("TORCH_MPIGPU_DESYNC_CHECK_INTERVAL", 1, kHuge);
  c.timeoutSeconds = parseTimeoutSeconds("TORCH_MPIGPU_TIMEOUT");
  c.abortOnTimeout =
      parseChoice<bool>("TORCH_MPIGPU_TIMEOUT_ACTION", {{"abort", true}, {"report", false}});
  c.cudaAware = parseChoice<CudaAware>(
      "TORCH_MPIGPU_CUDA_AWARE",
      {{"auto", CudaAware::Auto}, {"1", CudaAware::DevicePointers}, {"0", CudaAware::Staged}});
  c.cudaReduce = parseChoice<CudaReduce>(
      "TORCH_MPIGPU_CUDA_REDUCE",
      {{"auto", CudaReduce::Auto}, {"direct", CudaReduce::Direct}, {"staged", CudaReduce::Staged}});
  c.cudaOrderEventsAlways =
      parseChoice<bool>("TORCH_MPIGPU_CUDA_ORDER_EVENTS", {{"auto", false}, {"always", true}});
  c.cudaProbe = parseChoice<CudaProbe>("TORCH_MPIGPU_CUDA_PROBE",
                                       {{"auto", CudaProbe::Auto}, {"off", CudaProbe::Off}});
  if (parseFlag("TORCH_MPIGPU_TEST_CUDA_PROBE_FAILS") && c.cudaProbe == CudaProbe::Auto) {
    c.cudaProbe = CudaProbe::Fail;
  }
  c.anySourceRecv =
      parseChoice<AnySourceRecv>("TORCH_MPIGPU_ANY_SOURCE_RECV", {{"auto", AnySourceRecv::Auto},
                                                                  {"post", AnySourceRecv::Post},
                                                                  {"probe", AnySourceRecv::Probe}});
  c.algo = requiredValueOf("TORCH_MPIGPU_ALGO");
  c.stagingChunkBytes = parseInt("TORCH_MPIGPU_STAGING_CHUNK_BYTES", 1, kTiB);
  c.fusionBytes = parseInt("TORCH_MPIGPU_FUSION_BYTES", 0, kTiB);
  c.fuseBelowBytes = parseInt("TORCH_MPIGPU_FUSE_BELOW_BYTES", 0, kTiB);
  c.inlineBytes = parseInt("TORCH_MPIGPU_INLINE_BYTES", 0, kTiB);
  c.algoPieceBytes = parseInt("TORCH_MPIGPU_ALGO_PIECE_BYTES", 1, kTiB);
  c.algoMinBytes = parseInt("TORCH_MPIGPU_ALGO_MIN_BYTES", 0, kHuge);
  c.hostHalfRingBytes = parseInt("TORCH_MPIGPU_HOST_HALF_RING_BYTES", 0, kHuge);
  c.hostReduceScatterRingBytes = parseInt("TORCH_MPIGPU_HOST_RS_RING_BYTES", 0, kHuge);
  c.hostAcrossRingBytes = parseInt("TORCH_MPIGPU_HOST_ACROSS_RING_BYTES", 0, kHuge);
  c.cudaDirectBytes = parseInt("TORCH_MPIGPU_CUDA_DIRECT_BYTES", 0, kHuge);
  readNodeSettings(c);
  c.costLatencyUs = parseInt("TORCH_MPIGPU_COST_LATENCY_NS", 0, kHuge) / 1000.0;
  c.costBytesPerUs = static_cast<double>(parseInt("TORCH_MPIGPU_COST_MB_PER_S", 1, kHuge));
  c.costAcrossLatencyUs = parseInt("TORCH_MPIGPU_COST_ACROSS_LATENCY_NS", 0, kHuge) / 1000.0;
  c.costAcrossBytesPerUs =
      static_cast<double>(parseInt("TORCH_MPIGPU_COST_ACROSS_MB_PER_S", 1, kHuge));
  return c;
}

}  // namespace mpigpu
