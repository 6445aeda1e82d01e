#include "engine/Watchdog.hpp"

#include <mpi.h>

#include <condition_variable>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace mpigpu {
namespace {

using Clock = std::chrono::steady_clock;

struct Entry {
  Watchdog::Op op;
  Clock::time_point start;
  bool reported = false;
};

struct State {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<uint64_t, Entry> running;
  uint64_t nextId = 1;
  bool stop = false;
  std::thread thread;
};

State& state() {
  static State* s = new State();  // never destroyed: the thread may outlive static destructors
  return *s;
}

std::string report(const Entry& e, Clock::time_point now) {
  const auto ran = std::chrono::duration<double>(now - e.start).count();
  std::ostringstream s;
  s << "mpigpu WATCHDOG [rank " << e.op.rank << "]: " << e.op.name << " (op #" << e.op.seq
    << " of group '" << e.op.group << "', " << e.op.bytes << " bytes on this rank"
    << (e.op.onCaller ? ", running on the calling thread" : "") << ") has been inside MPI for "
    << ran << " s, past its timeout of " << e.op.timeout.count() / 1000.0
    << " s. Some rank is not calling this op, or calls ops in a different order (run with "
       "TORCH_MPIGPU_DEBUG=1 to log every op), or a rank has died. ";
  s << (e.op.abortOnTimeout ? "Ending the job (MPI_Abort); TORCH_MPIGPU_TIMEOUT_ACTION=report "
                              "only reports."
                            : "TORCH_MPIGPU_TIMEOUT_ACTION=report: the op keeps waiting.");
  return s.str();
}

void loop() {
  State& st = state();
  std::unique_lock<std::mutex> lock(st.mutex);
  while (!st.stop) {
    st.cv.wait_for(lock, std::chrono::milliseconds(200));
    const auto now = Clock::now();
    for (auto& [id, e] : st.running) {
      if (e.reported || now - e.start < e.op.timeout) continue;
      e.reported = true;
      std::cerr << report(e, now) << std::endl;
      if (e.op.abortOnTimeout) {
        int finalized = 1;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Abort(MPI_COMM_WORLD, 3);
      }
    }
  }
}

} // namespace

Watchdog::Scope::Scope(Op op) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  if (!st.thread.joinable() && !st.stop) st.thread = std::thread(loop);
  id_ = st.nextId++;
  st.running.emplace(id_, Entry{std::move(op), Clock::now(), false});
}

Watchdog::Scope::~Scope() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  st.running.erase(id_);
}

void Watchdog::stop() {
  State& st = state();
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    st.stop = true;
  }
  st.cv.notify_all();
  if (st.thread.joinable()) st.thread.join();
}

} // namespace mpigpu
