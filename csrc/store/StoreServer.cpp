#include "store/StoreServer.hpp"

#include <c10/util/Logging.h>

#include <sched.h>

#include <algorithm>

#include "core/Errors.hpp"
#include "engine/ThreadName.hpp"
#include "mpi/FaultTolerance.hpp"
#include "mpi/Check.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu::store {

const char* opName(Op op) {
  switch (op) {
    case Op::Set: return "set";
    case Op::Get: return "get";
    case Op::Add: return "add";
    case Op::CompareSet: return "compare_set";
    case Op::Check: return "check";
    case Op::Delete: return "delete_key";
    case Op::NumKeys: return "num_keys";
    case Op::Wait: return "wait";
    case Op::Append: return "append";
    case Op::MultiGet: return "multi_get";
    case Op::MultiSet: return "multi_set";
    case Op::ListKeys: return "list_keys";
    case Op::Cancel: return "cancel";
    case Op::Bye: return "bye";
  }
  return "unknown";
}

namespace {
// Requests served per pass before the pass tests its sends and lets go of the MPI mutex (below
// MPI_THREAD_MULTIPLE) for the shared engine's work.
constexpr int kRequestsPerPass = 256;
// At exit, how long replies still in flight may take before their requests are let go.
constexpr auto kSendDrain = std::chrono::seconds(2);
}  // namespace

StoreServer::StoreServer(MPI_Comm comm, int size)
    : comm_(comm), size_(size), thread_([this] { loop(); }) {}

StoreServer::~StoreServer() {
  if (thread_.joinable()) stopAndJoin(Clock::now());
}

void StoreServer::stopAndJoin(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    stopDeadline_ = deadline;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StoreServer::loop() {
  setThreadName("mpigpu-store");
  auto lastRequest = Clock::now();
  bool burst = true;  // start-up
  auto sleep = std::chrono::microseconds(kFirstSleep);
  bool warned = false;
  while (true) {
    bool served = false;
    try {
      mpi::SerialGuard inMpi;  // (serialized: beside the engine's calls, mpi/Wait.hpp)
      served = serveOnce();
    } catch (const std::exception& e) {
      mpi::SerialGuard inMpi;
      // MPI failed: the clients' calls end at their timeouts, naming their keys; say once why.
      // ULFM: a client died; once acknowledged, receives from any source work again
      if (!mpi::ft::failedRanks(comm_).empty()) {
        mpi::ft::acknowledge(comm_);
      } else {
        if (!warned) LOG(WARNING) << opMessage("store server", 0, e.what());
        warned = true;
      }
    }
    if (finished()) break;
    const auto now = Clock::now();
    if (served) {
      burst = now - lastRequest < kBurstGap;
      lastRequest = now;
      sleep = kFirstSleep;
      continue;
    }
    if (burst && now - lastRequest < kYieldAfterRequest) {
      // A burst (start-up, a barrier): the next request is likely a round trip away; yield
      // the core rather than sleep past it.
      sched_yield();
      continue;
    }
    const auto cap = now - lastRequest < kBusyWindow
                         ? std::chrono::duration_cast<std::chrono::microseconds>(kBusyCap)
                         : std::chrono::duration_cast<std::chrono::microseconds>(kIdleCap);
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, sleep);
    sleep = std::min(sleep * 2, cap);
  }
  releaseSends();
}

// Whether the loop may end: asked to stop, and every rank said Bye (or the deadline passed).
bool StoreServer::finished() {
  mpi::SerialGuard inMpi;  // (failedRanks asks MPI)
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stop_) return false;
  // ULFM: a rank that failed says no Bye (and MPI_Finalize waits for this rank on the others)
  for (int r : mpi::ft::failedRanks(comm_)) byes_.insert(r);
  if (static_cast<int>(byes_.size()) == size_) return true;
  if (Clock::now() < stopDeadline_) return false;
  std::string missing;
  for (int r = 0; r < size_ && missing.size() < 200; ++r) {
    if (!byes_.count(r)) missing += (missing.empty() ? "" : ",") + std::to_string(r);
  }
  LOG(WARNING) << opMessage("store server", 0, "stopping at exit before rank(s) ", missing,
                            " closed their MPI store (they have not reached exit, or died); "
                            "a store call they make now fails at its timeout");
  return true;
}

bool StoreServer::serveOnce() {
  const int me = 0;
  bool any = false;
  for (int i = 0; i < kRequestsPerPass; ++i) {
    const int from = receiveWhole(comm_, MPI_ANY_SOURCE, kRequestTag, buffer_, "store server", me);
    if (from < 0) break;
    handle(from, buffer_);
    any = true;
  }
  testSends();
  return any;
}

void StoreServer::handle(int source, const std::vector<uint8_t>& bytes) {
  Reader in(bytes);
  Op op{};
  int tag = -1;
  try {
    op = static_cast<Op>(in.u8());
    tag = static_cast<int>(in.i64());
    switch (op) {
      case Op::Set:
      case Op::Add:
      case Op::CompareSet:
      case Op::Append:
      case Op::MultiSet:
      case Op::Delete: handleWrite(op, source, tag, in); break;
      case Op::Check:
      case Op::NumKeys:
      case Op::ListKeys: handleRead(op, source, tag, in); break;
      case Op::Get:
      case Op::Wait:
      case Op::MultiGet:
      case Op::Cancel: handleWaiting(op, source, tag, in); break;
      case Op::Bye: handleBye(source); break;
      default: fail(source, tag, "unknown request");
    }
  } catch (const std::exception& e) {
    LOG(WARNING) << opMessage("store server", 0, "a malformed request from rank ", source, " (",
                              e.what(), ") was dropped");
    if (tag >= kFirstReplyTag) fail(source, tag, e.what());
  }
}

void StoreServer::handleWrite(Op op, int source, int tag, Reader& in) {
  Writer out;
  out.u8(static_cast<uint8_t>(Status::Ok));
  std::vector<std::string> written;
  if (op == Op::Set || op == Op::Append) {
    auto key = in.str();
    auto value = in.blob();
    auto& held = data_[key];
    if (op == Op::Set)
      held = std::move(value);
    else
      held.insert(held.end(), value.begin(), value.end());
    written.push_back(std::move(key));
  } else if (op == Op::Add) {
    auto key = in.str();
    const int64_t by = in.i64();
    auto& held = data_[key];
    const int64_t now = (held.empty() ? 0 : std::stoll(std::string(held.begin(), held.end()))) + by;
    const auto text = std::to_string(now);
    held.assign(text.begin(), text.end());
    out.i64(now);
    written.push_back(std::move(key));
  } else if (op == Op::CompareSet) {
    // As TCPStore: a missing key is set only when `expected` is empty; the reply is the value
    // held afterwards (or `expected`, for a missing key left unset).
    auto key = in.str();
    auto expected = in.blob();
    auto desired = in.blob();
    const auto it = data_.find(key);
    if (it == data_.end() && !expected.empty()) {
      out.blob(expected);
    } else {
      if (it == data_.end() || it->second == expected) data_[key] = std::move(desired);
      out.blob(data_[key]);
      written.push_back(std::move(key));
    }
  } else if (op == Op::MultiSet) {
    auto keys = in.strs();
    for (auto& k : keys) data_[k] = in.blob();
    written = std::move(keys);
  } else {  // Delete
    out.u8(data_.erase(in.str()) ? 1 : 0);
  }
  reply(source, tag, out);
  for (const auto& k : written) keyWritten(k);
}

void StoreServer::handleRead(Op op, int source, int tag, Reader& in) {
  Writer out;
  out.u8(static_cast<uint8_t>(Status::Ok));
  if (op == Op::Check) {
    const auto keys = in.strs();
    const bool all = std::all_of(keys.begin(), keys.end(),
                                 [&](const std::string& k) { return data_.count(k) > 0; });
    out.u8(all ? 1 : 0);
  } else if (op == Op::NumKeys) {
    out.i64(static_cast<int64_t>(data_.size()));
  } else {
    std::vector<std::string> keys;
    keys.reserve(data_.size());
    for (const auto& kv : data_) keys.push_back(kv.first);
    out.strs(keys);
  }
  reply(source, tag, out);
}

void StoreServer::handleWaiting(Op op, int source, int tag, Reader& in) {
  if (op == Op::Cancel) {
    // The client gave up waiting: answer the waiting request on its tag, if not answered yet.
    const WaiterId id{source, static_cast<int>(in.i64())};
    if (waiters_.erase(id)) {
      Writer out;
      out.u8(static_cast<uint8_t>(Status::Cancelled));
      reply(source, id.second, out);
    }
    return;
  }
  Waiter w{op, op == Op::Get ? std::vector<std::string>{in.str()} : in.strs()};
  const WaiterId id{source, tag};
  if (ready(w)) {
    answer(id, w);
    return;
  }
  parkUnder(id, w);
  waiters_.emplace(id, std::move(w));
}

// A rank closed its store at exit: whoever still waits for a key now waits for nothing that
// rank will set; each such wait ends with an error naming its key and the rank that left.
void StoreServer::handleBye(int source) {
  byes_.insert(source);
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->first.first == source) {
      ++it;
      continue;
    }
    std::string missing;
    for (const auto& k : it->second.keys) {
      if (!data_.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
    }
    fail(it->first.first, it->first.second,
         c10::str("rank ", source,
                  " closed its store (it reached exit or left the job) while "
                  "this rank waited for key(s) ",
                  missing,
                  "; no rank that has left sets them. "
                  "Find why rank ",
                  source,
                  " ended early (its output), or make every rank "
                  "reach this point"));
    it = waiters_.erase(it);
  }
}

bool StoreServer::ready(const Waiter& w) const {
  return std::all_of(w.keys.begin(), w.keys.end(),
                     [&](const std::string& k) { return data_.count(k) > 0; });
}

void StoreServer::answer(const WaiterId& id, const Waiter& w) {
  Writer out;
  out.u8(static_cast<uint8_t>(Status::Ok));
  if (w.op != Op::Wait) {
    for (const auto& k : w.keys) out.blob(data_.at(k));
  }
  reply(id.first, id.second, out);
}

void StoreServer::parkUnder(const WaiterId& id, const Waiter& w) {
  for (const auto& k : w.keys) {
    if (!data_.count(k)) {
      parked_[k].push_back(id);
      return;
    }
  }
}

// Answers the requests parked under `key` whose keys now all exist; parks the others under
// their next missing key. Each waiter sits under one key, so a write costs only its own waiters.
void StoreServer::keyWritten(const std::string& key) {
  const auto it = parked_.find(key);
  if (it == parked_.end()) return;
  std::vector<WaiterId> ids = std::move(it->second);
  parked_.erase(it);
  for (const auto& id : ids) {
    const auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;  // cancelled, or failed at a Bye
    if (ready(w->second)) {
      answer(id, w->second);
      waiters_.erase(w);
    } else {
      parkUnder(id, w->second);
    }
  }
}

void StoreServer::fail(int source, int tag, const std::string& why) {
  Writer out;
  out.u8(static_cast<uint8_t>(Status::Failed)).str(why);
  reply(source, tag, out);
}

void StoreServer::reply(int source, int tag, Writer& out) {
  sends_.push_back(Send{std::move(out.bytes()), MPI_REQUEST_NULL});
  auto& s = sends_.back();
  MPIGPU_MPI_CHECK(MPI_Isend(s.bytes.data(), static_cast<int>(s.bytes.size()), MPI_BYTE, source,
                             tag, comm_, &s.request),
                   "store server", 0);
}

void StoreServer::testSends() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    MPIGPU_MPI_CHECK(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "store server", 0);
    it = done ? sends_.erase(it) : std::next(it);
  }
}

// At exit: replies still unsent after kSendDrain (a client that gave up on its tag) are let go;
// their buffers stay allocated, since MPI may still read them.
void StoreServer::releaseSends() {
  const auto until = Clock::now() + kSendDrain;
  while (!sends_.empty() && Clock::now() < until) {
    try {
      mpi::SerialGuard inMpi;
      testSends();
    } catch (const std::exception&) {
      break;
    }
    if (!sends_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (sends_.empty()) return;
  static auto* kept = new std::list<Send>();  // never freed: MPI may still read them
  mpi::SerialGuard inMpi;
  for (auto& s : sends_) MPI_Request_free(&s.request);
  kept->splice(kept->end(), sends_);
}

}  // namespace mpigpu::store
