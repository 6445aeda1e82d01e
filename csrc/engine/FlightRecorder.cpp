#include "engine/FlightRecorder.hpp"

#include "core/Settings.hpp"
#include "core/TorchCompat.hpp"

// torch's recorder header: its format version, kept in step with the analyzer of the installed
// torch; and its DebugInfoWriter (exported), so a writer a user registered with torch gets our
// dumps too.
#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#include <torch/csrc/distributed/c10d/TraceUtils.h>
#include <torch/csrc/distributed/c10d/Utils.hpp>
#include <torch/csrc/profiler/combined_traceback.h>

#include <c10/util/thread_name.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <functional>
#include <sstream>
#include <thread>

#include "mpi/Env.hpp"

namespace mpigpu::fr {

struct Recorder::Entry {
  uint64_t id = 0;
  Op op;
  c10::time_t created = 0;
  std::optional<c10::time_t> started, completed;
  std::optional<float> durationMs;
  // Flattened as torch's recorder keeps them: every tensor's sizes in a row, its rank in *Dims.
  c10::SmallVector<int64_t, 8> sizes;
  c10::SmallVector<int64_t, 4> inputDims, outputDims;
  c10::SmallVector<c10::ScalarType, 4> inputTypes, outputTypes;
  std::shared_ptr<torch::CapturedTraceback> traceback;
  uint64_t thread = 0;
};

// The dump's field names (torch's format; torch's own constants are missing from older torch
// versions, so they are spelled out here). The format version is torch's.
namespace k {
const std::string collective_seq_id_key = "collective_seq_id";
const std::string comm_lib_version_key = compat::flightRecorderLibVersionKey();
const std::string completed_state = "completed";
const std::string duration_key = "duration_ms";
const std::string entries_key = "entries";
const std::string filename_key = "filename";
const std::string frames_key = "frames";
const std::string input_dtypes_key = "input_dtypes";
const std::string is_p2p_key = "is_p2p";
const std::string input_sizes_key = "input_sizes";
const std::string line_key = "line";
const std::string name_key = "name";
const std::string op_id_key = "op_id";
const std::string output_dtypes_key = "output_dtypes";
const std::string output_sizes_key = "output_sizes";
const std::string p2p_seq_id_key = "p2p_seq_id";
const std::string pg_config_key = "pg_config";
const std::string pg_id_key = "pg_id";
const std::string pg_name_key = "process_group";
const std::string pg_status_key = "pg_status";
const std::string profiling_name_key = "profiling_name";
const std::string record_id_key = "record_id";
const std::string retired_key = "retired";
const std::string scheduled_state = "scheduled";
const std::string started_state = "started";
const std::string state_key = "state";
const std::string thread_id_key = "thread_id";
const std::string thread_name_key = "thread_name";
const std::string time_created_key = "time_created_ns";
const std::string time_discovered_completed_key = "time_discovered_completed_ns";
const std::string time_discovered_started_key = "time_discovered_started_ns";
const std::string timeout_key = "timeout_ms";
const std::string version_key = "version";
}  // namespace k

namespace {

void describeTensors(const std::vector<at::Tensor>& tensors, c10::SmallVector<int64_t, 8>& sizes,
                     c10::SmallVector<int64_t, 4>& dims,
                     c10::SmallVector<c10::ScalarType, 4>& types) {
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    sizes.append(t.sizes().begin(), t.sizes().end());
    dims.push_back(t.dim());
    types.push_back(t.scalar_type());
  }
}

// [[sizes of tensor 0], [sizes of tensor 1], ...], read from the flattened sizes at `at`.
c10::List<c10::IValue> sizesList(const c10::SmallVector<int64_t, 4>& dims,
                                 const c10::SmallVector<int64_t, 8>& sizes, size_t& at) {
  auto list = c10d::new_list();
  for (auto n : dims) {
    auto one = c10d::new_list();
    for (int64_t i = 0; i < n; ++i) one.push_back(sizes[at++]);
    list.push_back(one);
  }
  return list;
}

std::vector<std::string> typeNames(const c10::SmallVector<c10::ScalarType, 4>& types) {
  std::vector<std::string> names;
  for (auto t : types) names.emplace_back(c10::toString(t));
  return names;
}

// "[0, 1, 2]", as torch writes a group's ranks (its ranks_str uses fmt, which libtorch does not
// export).
std::string ranksText(const std::vector<uint64_t>& ranks) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  s << "]";
  return s.str();
}

c10::IValue optionalTime(const std::optional<c10::time_t>& t) {
  return t ? c10::IValue(static_cast<int64_t>(*t)) : c10::IValue();
}

}  // namespace

Recorder::Recorder()
    : capacity_(static_cast<size_t>(std::max(
          0, c10d::getCvarInt({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)))),
      pythonStacks_(c10d::getCvarBool(
          {"TORCH_MPIGPU_FR_STACKS"},
          std::string_view(setting("TORCH_MPIGPU_FR_STACKS").defaultValue) == "1")),
      cppStacks_(c10d::getCvarBool({"TORCH_FR_CPP_STACK", "TORCH_NCCL_TRACE_CPP_STACK"}, false)) {}

Recorder::~Recorder() = default;

Recorder& Recorder::get() {
  // Never destroyed: entries hold Python stacks, and ops may complete during interpreter exit.
  static Recorder* recorder = new Recorder();
  return *recorder;
}

size_t Recorder::addGroup(const std::string& name, const std::vector<int>& worldRanks) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.push_back(Group{name, "", std::vector<uint64_t>(worldRanks.begin(), worldRanks.end())});
  return groups_.size() - 1;
}

uint64_t Recorder::threadKey() {
  // Thread ids and names are looked up once per thread, not per op (a name is a syscall).
  static std::atomic<uint64_t> nextKey{1};
  thread_local uint64_t key = 0;
  if (key == 0) {
    key = nextKey++;
    std::lock_guard<std::mutex> lock(mutex_);
    threads_[key] = {std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())),
                     c10::getThreadName()};
  }
  return key;
}

namespace {
// Wall-clock nanoseconds of a steady_clock reading: the two clocks' offset, taken once.
c10::time_t wallNs(Recorder::When at) {
  static const int64_t offset =
      c10::getTime() - std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
  return offset +
         std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
}
}  // namespace

uint64_t Recorder::record(const Op& op, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, When created) {
  if (!enabled()) return kNone;
  // Symbolized only when dumped, as torch's recorder does; gathered outside the lock
  // (microseconds).
  std::shared_ptr<torch::CapturedTraceback> traceback;
  if (pythonStacks_ || cppStacks_) {
    traceback = torch::CapturedTraceback::gather(pythonStacks_, pythonStacks_, cppStacks_);
  }
  const uint64_t thread = threadKey();
  const bool inPlace =
      inputs.size() == outputs.size() &&
      std::equal(inputs.begin(), inputs.end(), outputs.begin(),
                 [](const at::Tensor& a, const at::Tensor& b) { return a.is_same(b); });
  std::lock_guard<std::mutex> lock(mutex_);
  Group& g = groups_.at(op.groupId);
  if (!op.p2p) g.enqueued = static_cast<int64_t>(op.collectiveSeq);
  // torch describes a group after creating it; the first op sees the description.
  if (op.desc && g.desc != *op.desc) g.desc = *op.desc;
  const uint64_t id = nextId_++;
  if (entries_.size() < capacity_) {
    entries_.emplace_back();
  } else {
    next_ = (next_ + 1) % capacity_;
  }
  // Written in place, the oldest entry's vectors reused: recording allocates nothing once the
  // buffer is full (a small op's own cost, #68).
  Entry& e = entries_[id % capacity_];
  e.id = id;
  e.op = op;
  e.op.desc = nullptr;  // the group's, which may go before the entry does
  e.created = wallNs(created);
  e.started.reset();
  e.completed.reset();
  e.durationMs.reset();
  e.sizes.clear();
  e.inputDims.clear();
  e.inputTypes.clear();
  e.outputDims.clear();
  e.outputTypes.clear();
  describeTensors(inputs, e.sizes, e.inputDims, e.inputTypes);
  if (inPlace) {  // all_reduce and friends: the outputs are the inputs (a coalesced one has many)
    const size_t n = e.sizes.size();
    e.sizes.reserve(2 * n);
    e.sizes.append(e.sizes.begin(), e.sizes.begin() + static_cast<std::ptrdiff_t>(n));
    e.outputDims = e.inputDims;
    e.outputTypes = e.inputTypes;
  } else {
    describeTensors(outputs, e.sizes, e.outputDims, e.outputTypes);
  }
  e.traceback = std::move(traceback);
  e.thread = thread;
  return id;
}

Recorder::Entry* Recorder::find(uint64_t id) {
  // Ids count from 0 and the buffer wraps: id k sits at k % capacity until overwritten.
  if (id == kNone || id % capacity_ >= entries_.size()) return nullptr;
  Entry& e = entries_[id % capacity_];
  return e.id == id ? &e : nullptr;
}

void Recorder::started(uint64_t id, When at) {
  if (id == kNone) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->started = wallNs(at);
    if (!e->op.p2p) groups_.at(e->op.groupId).started = static_cast<int64_t>(e->op.collectiveSeq);
  }
}

void Recorder::finished(uint64_t id, When at, float durationMs) {
  if (id == kNone) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->completed = wallNs(at);
    if (!e->started) e->started = e->completed;
    e->durationMs = durationMs;
    if (!e->op.p2p) groups_.at(e->op.groupId).completed = static_cast<int64_t>(e->op.collectiveSeq);
  }
}

struct Recorder::Snapshot {
  std::vector<Entry> entries;  // oldest first
  std::vector<Group> groups;
  std::map<uint64_t, std::pair<std::string, std::string>> threads;
};

Recorder::Snapshot Recorder::snapshot() {
  Snapshot s;
  std::lock_guard<std::mutex> lock(mutex_);
  // Oldest first: from next_ to the end, then the start.
  const auto split = entries_.begin() + static_cast<std::ptrdiff_t>(next_);
  s.entries.insert(s.entries.end(), split, entries_.end());
  s.entries.insert(s.entries.end(), entries_.begin(), split);
  s.groups = groups_;
  s.threads = threads_;
  return s;
}

// torch's pg_config (name, desc, ranks by group name) and pg_status (by group id).
std::pair<c10::IValue, c10::IValue> Recorder::groupTables(const std::vector<Group>& groups) {
  auto pgConfig = c10d::new_dict();
  auto pgStatus = c10d::new_dict();
  for (size_t id = 0; id < groups.size(); ++id) {
    const Group& g = groups[id];
    auto info = c10d::new_dict();
    info.insert("name", g.name);
    info.insert("desc", g.desc);
    info.insert("ranks", ranksText(g.ranks));
    pgConfig.insert(g.name, info);
    auto status = c10d::new_dict();
    status.insert("last_enqueued_collective", g.enqueued);
    status.insert("last_started_collective", g.started);
    status.insert("last_completed_collective", g.completed);
    pgStatus.insert(std::to_string(id), status);
  }
  return {pgConfig, pgStatus};
}

// Each entry's Python stack as a list of frame dicts (empty where none was recorded).
// Symbolizing takes the GIL for Python frames: call it outside our lock.
std::vector<c10::IValue> Recorder::symbolizedStacks(const std::vector<Entry>& entries) {
  std::vector<torch::CapturedTraceback*> tracebacks;
  std::vector<size_t> stackOf(entries.size(), SIZE_MAX);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].traceback) continue;
    stackOf[i] = tracebacks.size();
    tracebacks.push_back(entries[i].traceback.get());
  }
  torch::SymbolizedTracebacks symbolized;
  if (!tracebacks.empty()) symbolized = torch::symbolize(tracebacks);
  std::vector<c10::IValue> frames;
  for (const auto& f : symbolized.all_frames) {
    auto d = c10d::new_dict();
    d.insert(k::name_key, f.funcname);
    d.insert(k::filename_key, f.filename);
    d.insert(k::line_key, static_cast<int64_t>(f.lineno));
    frames.emplace_back(std::move(d));
  }
  std::vector<c10::IValue> stacks;
  for (size_t i = 0; i < entries.size(); ++i) {
    auto stack = c10d::new_list();
    if (stackOf[i] != SIZE_MAX) {
      for (auto f : symbolized.tracebacks.at(stackOf[i])) stack.push_back(frames.at(f));
    }
    stacks.emplace_back(std::move(stack));
  }
  return stacks;
}

// One entry in torch's format (c10d's FlightRecorder keys).
c10::IValue Recorder::entryDict(const Entry& e, const Snapshot& s) {
  const Group& g = s.groups.at(e.op.groupId);
  auto d = c10d::new_dict();
  std::string name = e.op.title;
  // torchfrtrace's point-to-point form, in group ranks: "send 0->1", "recv 1<-0".
  if (e.op.p2p) {
    name += e.op.send ? c10::str(" ", e.op.self, "->", e.op.peer)
                      : c10::str(" ", e.op.self, "<-", e.op.peer);
  }
  d.insert(k::record_id_key, static_cast<int64_t>(e.id));
  d.insert(k::pg_id_key, static_cast<int64_t>(e.op.groupId));
  d.insert(k::pg_name_key, std::make_tuple(g.name, g.desc));
  d.insert(k::collective_seq_id_key, static_cast<int64_t>(e.op.collectiveSeq));
  d.insert(k::p2p_seq_id_key, static_cast<int64_t>(e.op.p2pSeq));
  // Each op is one logical op here (no fused NCCL-style groups): numbered in issue order.
  d.insert(k::op_id_key, static_cast<int64_t>(e.op.collectiveSeq + e.op.p2pSeq));
  d.insert(k::profiling_name_key, name);
  d.insert(k::time_created_key, static_cast<int64_t>(e.created));
  if (e.durationMs) d.insert(k::duration_key, static_cast<double>(*e.durationMs));
  size_t at = 0;
  d.insert(k::input_sizes_key, sizesList(e.inputDims, e.sizes, at));
  d.insert(k::input_dtypes_key, typeNames(e.inputTypes));
  d.insert(k::output_sizes_key, sizesList(e.outputDims, e.sizes, at));
  d.insert(k::output_dtypes_key, typeNames(e.outputTypes));
  d.insert(k::state_key, e.completed ? k::completed_state
                         : e.started ? k::started_state
                                     : k::scheduled_state);
  d.insert(k::time_discovered_started_key, optionalTime(e.started));
  d.insert(k::time_discovered_completed_key, optionalTime(e.completed));
  d.insert(k::retired_key, e.completed.has_value());
  d.insert(k::timeout_key, static_cast<int64_t>(e.op.timeout.count()));
  d.insert(k::is_p2p_key, e.op.p2p);
  const auto thread = s.threads.find(e.thread);
  d.insert(k::thread_id_key, thread == s.threads.end() ? "" : thread->second.first);
  d.insert(k::thread_name_key, thread == s.threads.end() ? "" : thread->second.second);
  return d;
}

std::string Recorder::dump(bool stackTraces, bool onlyActive) {
  const Snapshot s = snapshot();
  const std::vector<c10::IValue> stacks =
      stackTraces ? symbolizedStacks(s.entries) : std::vector<c10::IValue>{};
  auto list = c10d::new_list();
  for (size_t i = 0; i < s.entries.size(); ++i) {
    if (onlyActive && s.entries[i].completed) continue;
    c10::IValue entry = entryDict(s.entries[i], s);
    if (stackTraces) entry.toGenericDict().insert(k::frames_key, stacks[i]);
    list.push_back(entry);
  }
  auto [pgConfig, pgStatus] = groupTables(s.groups);
  auto result = c10d::new_dict();
  result.insert(k::version_key, c10d::version_val_str);
  result.insert(k::comm_lib_version_key, mpi::ensureInitialized().libraryVersion);
  result.insert(k::pg_config_key, pgConfig);
  result.insert(k::pg_status_key, pgStatus);
  result.insert(k::entries_key, list);
  return c10d::pickle_str(result);
}

namespace {
// Where torch's writer puts a dump: its getWriterTarget() where this torch has one.
template <typename Writer>
auto targetOf(Writer& w, int) -> decltype(w.getWriterTarget()) {
  return w.getWriterTarget();
}
template <typename Writer>
std::string targetOf(Writer&, long) {
  return "torch's DebugInfoWriter (TORCH_FR_DUMP_TEMP_FILE<rank>)";
}
}  // namespace

std::string Recorder::write(int worldRank) {
  auto& writer = c10d::DebugInfoWriter::getWriter(worldRank);
  writer.write(dump(/*stackTraces=*/true, /*onlyActive=*/false));
  return targetOf(writer, 0);
}

}  // namespace mpigpu::fr
