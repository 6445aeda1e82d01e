#include "Profiling.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

namespace mpigpu {

// The names NCCL gives these ops, which torch's flight-recorder analyzer knows.
const char* profilingTitle(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "mpigpu:broadcast";
    case c10d::OpType::ALLREDUCE: return "mpigpu:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "mpigpu:allreduce_coalesced";
    case c10d::OpType::REDUCE: return "mpigpu:reduce";
    case c10d::OpType::ALLGATHER: return "mpigpu:all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "mpigpu:_all_gather_base";
    case c10d::OpType::ALLGATHER_COALESCED: return "mpigpu:all_gather_into_tensor_coalesced";
    case c10d::OpType::GATHER: return "mpigpu:gather";
    case c10d::OpType::SCATTER: return "mpigpu:scatter";
    case c10d::OpType::REDUCE_SCATTER: return "mpigpu:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "mpigpu:_reduce_scatter_base";
    case c10d::OpType::ALLTOALL_BASE: return "mpigpu:all_to_all_single";
    case c10d::OpType::ALLTOALL: return "mpigpu:all_to_all";
    case c10d::OpType::SEND: return "mpigpu:send";
    case c10d::OpType::RECV:
    case c10d::OpType::RECVANYSOURCE: return "mpigpu:recv";
    case c10d::OpType::BARRIER: return "mpigpu:barrier";
    case c10d::OpType::COALESCED: return "mpigpu:coalesced";
    default: return "mpigpu:unknown";
  }
}

namespace {

int64_t elements(const std::vector<at::Tensor>* tensors) {
  int64_t n = 0;
  if (tensors) {
    for (const auto& t : *tensors) n += t.defined() ? t.numel() : 0;
  }
  return n;
}

// NCCL's convention: the first member's world rank, and the stride when the members are evenly
// spaced (else -1).
std::pair<int, int> rankStartAndStride(const std::vector<int>& ranks) {
  if (ranks.empty()) return {0, 1};
  if (ranks.size() == 1) return {ranks[0], 1};
  const int stride = ranks[1] - ranks[0];
  for (size_t i = 2; i < ranks.size(); ++i) {
    if (ranks[i] - ranks[i - 1] != stride) return {ranks[0], -1};
  }
  return {ranks[0], stride};
}

}  // namespace

bool profilerActive() {
  return at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE).has_value();
}

void recordParamComms(const CommsParams& p) {
  if (!p.profiling) return;  // no profiler: build nothing
  const auto pgName = std::make_tuple(*p.group, *p.desc);
  const auto [start, stride] = rankStartAndStride(*p.worldRanks);
  const at::Tensor* first = nullptr;
  for (const auto* list : {p.inputs, p.outputs}) {
    if (!first && list && !list->empty() && (*list)[0].defined()) first = &(*list)[0];
  }
  const auto dtype = first ? first->scalar_type() : at::kByte;
  const std::vector<int64_t> inSplits, outSplits;
  const std::vector<at::Tensor> none;
  // torch's macro: the debug info for the profiler's collectors, and the record_param_comms
  // event with the same parameters as its inputs. Older torch (before 2.13) has only the variant
  // without the async flag and the (sequence, is-p2p) pair.
#ifdef RECORD_PARAM_COMMS_DATA_WITH_ASYNC_OP
  const auto seq = std::make_tuple(static_cast<int64_t>(p.seq), p.p2p);
  RECORD_PARAM_COMMS_DATA_WITH_ASYNC_OP(seq, pgName, p.inputs ? *p.inputs : none,
                                        p.outputs ? *p.outputs : none, p.rank, std::string(p.op),
                                        elements(p.inputs), elements(p.outputs), dtype, inSplits,
                                        outSplits, start, stride, p.size, p.asyncOp);
#else
  const auto seq = static_cast<int64_t>(p.seq);
  RECORD_PARAM_COMMS_DATA(seq, pgName, p.inputs ? *p.inputs : none, p.outputs ? *p.outputs : none,
                          p.rank, std::string(p.op), elements(p.inputs), elements(p.outputs), dtype,
                          inSplits, outSplits, start, stride, p.size);
#endif
}

}  // namespace mpigpu
