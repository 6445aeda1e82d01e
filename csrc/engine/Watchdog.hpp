// Watches every collective in flight, on an engine thread or inline on a caller. One that runs
// past its timeout is reported on stderr (op, sequence number, group, bytes, how long it has run)
// and, by default, the job is ended with MPI_Abort: a blocked MPI call cannot be cancelled, and a
// job whose ranks disagree about what to run next only burns time
// (TORCH_MPIGPU_TIMEOUT_ACTION=abort|report).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mpigpu {

class Watchdog {
 public:
  struct Op {
    std::string group;
    const char* name = "";
    uint64_t seq = 0;
    int rank = 0;
    int64_t bytes = 0;
    std::chrono::milliseconds timeout{0};
    bool onCaller = false;  // inline on the calling thread (Work.wait's timeout cannot help)
    bool abortOnTimeout = true;
  };

  // Registers `op` as running from now; the returned guard ends the watch when it goes.
  class Scope {
   public:
    explicit Scope(Op op);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    uint64_t id_;
  };

  // Stops the watchdog thread (at exit, before MPI_Finalize).
  static void stop();
};

} // namespace mpigpu
