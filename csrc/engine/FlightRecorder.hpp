// The flight recorder: the last TORCH_FR_BUFFER_SIZE ops of this process (torch's variable and
// default, 2000; 0 turns it off), each with its group, collective and point-to-point numbers,
// sizes, dtypes, state (scheduled, started, completed), times, timeout and the issuing thread;
// with TORCH_MPIGPU_FR_STACKS=1 also the Python stack that issued it (off by default: capturing
// it costs a few microseconds per op, more than the rest of a small op's overhead). Dumped in
// torch's flight-recorder format (the pickle torch's analyzer reads), one file per rank through
// torch's DebugInfoWriter (TORCH_FR_DUMP_TEMP_FILE, default /tmp/nccl_trace_rank_<rank>): on a
// watchdog timeout, on every rank of the job (the watchdog signals the others through the store),
// and on demand (torch_mpi_gpu.flight_recorder). torch's own recorder (FlightRecorder<c10::Event>)
// lives inside libtorch with hidden symbols, so a third-party backend cannot record into it; this
// one writes the same dump instead.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ApproximateClock.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <utility>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace torch {
struct CapturedTraceback;
}

namespace mpigpu::fr {

class Recorder {
 public:
  static constexpr uint64_t kNone = ~uint64_t{0};

  static Recorder& get();
  bool enabled() const { return capacity_ > 0; }

  // A group's members as world ranks, under its name; returns the group's id in the dump.
  size_t addGroup(const std::string& name, const std::vector<int>& worldRanks);

  struct Op {
    size_t groupId = 0;
    const std::string* desc = nullptr;  // torch's description of the group (set after creation)
    uint64_t collectiveSeq = 0, p2pSeq = 0;
    const char* title = "";  // the profiler's name, "mpigpu:all_reduce" (a static string)
    bool p2p = false;
    int self = -1, peer = -1;  // point-to-point: group ranks, for "send 0->1" / "recv 1<-0"
    bool send = false;
    std::chrono::milliseconds timeout{0};
  };
  // Records an op as scheduled; returns its id, or kNone when the recorder is off. A few
  // hundred nanoseconds without stacks (TORCH_MPIGPU_FR_STACKS=1 adds the Python stack, a few
  // microseconds).
  // The times are the Work's own clock readings (steady_clock), kept as the dump's wall-clock
  // nanoseconds: reading the clock again here costs tens of nanoseconds each, per op.
  using When = std::chrono::steady_clock::time_point;
  uint64_t record(const Op& op, const std::vector<at::Tensor>& inputs,
                  const std::vector<at::Tensor>& outputs, When created);
  void started(uint64_t id, When at);
  void finished(uint64_t id, When at, float durationMs);

  // This process's record in torch's format, pickled; `onlyActive` leaves out completed ops.
  std::string dump(bool stackTraces, bool onlyActive);
  // Writes dump(true, false) through torch's DebugInfoWriter for `worldRank` (its file name ends
  // with the rank); returns where it went.
  std::string write(int worldRank);

 private:
  Recorder();
  ~Recorder();
  struct Entry;
  struct Group {
    std::string name, desc;
    std::vector<uint64_t> ranks;
    // torch's ProcessGroupStatus: the last collective enqueued, started and completed
    int64_t enqueued = -1, started = -1, completed = -1;
  };
  struct Snapshot;  // a copy of the entries, groups and thread names, for dump()
  Snapshot snapshot();
  static std::pair<c10::IValue, c10::IValue> groupTables(const std::vector<Group>& groups);
  static std::vector<c10::IValue> symbolizedStacks(const std::vector<Entry>& entries);
  static c10::IValue entryDict(const Entry& e, const Snapshot& s);
  Entry* find(uint64_t id);  // with mutex_ held; nullptr once overwritten
  uint64_t threadKey();      // this thread's key into threads_, registering it once

  const size_t capacity_;
  const bool pythonStacks_, cppStacks_;
  std::mutex mutex_;
  std::vector<Entry> entries_;
  size_t next_ = 0;  // where the next entry goes once the buffer is full
  uint64_t nextId_ = 0;
  std::vector<Group> groups_;                                        // by id
  std::map<uint64_t, std::pair<std::string, std::string>> threads_;  // key -> (id, name)
};

}  // namespace mpigpu::fr
