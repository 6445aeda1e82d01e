#include "store/MpiStore.hpp"

#include <sched.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "core/Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu::store {

namespace {
// Waiting for a reply: sched_yield for kYieldFor (a reply a round trip away), then sleeps growing
// from kFirstPause to kMaxPause, so a rank waiting long for a key costs a wake-up per kMaxPause
// and no core.
constexpr auto kYieldFor = std::chrono::microseconds(200);
constexpr auto kFirstPause = std::chrono::microseconds(20);
constexpr auto kMaxPause = std::chrono::microseconds(2000);
// After a timed-out wait is cancelled, how long the server may take to answer the cancel.
constexpr auto kCancelWait = std::chrono::seconds(30);

// A call given up: its sends are let go (MPI may still deliver them) and their bytes kept
// until exit, since MPI may still read them.
void abandon(Channel& channel, std::vector<MPI_Request>& sends, std::vector<uint8_t>& request,
             std::vector<uint8_t>& cancel) {
  static auto* kept = new std::vector<std::vector<uint8_t>>();
  static std::mutex keptMutex;
  try {
    channel.mpi("store call", [&] {
      for (auto& s : sends) {
        if (s != MPI_REQUEST_NULL) MPI_Request_free(&s);
      }
    });
  } catch (const std::exception&) {
  }
  std::lock_guard<std::mutex> lock(keptMutex);
  kept->push_back(std::move(request));
  kept->push_back(std::move(cancel));
}

std::atomic<uint64_t> g_calls{0};

bool waits(Op op) { return op == Op::Get || op == Op::Wait || op == Op::MultiGet; }

std::string quoted(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) s += c10::str(", ... (", keys.size(), " keys)");
  return s;
}
}  // namespace

MpiStore::MpiStore(std::shared_ptr<Channel> channel, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), channel_(std::move(channel)) {}

uint64_t callsMade() { return g_calls.load(std::memory_order_relaxed); }

c10::intrusive_ptr<MpiStore> makeMpiStore(MPI_Comm comm, std::chrono::milliseconds timeout,
                                          const char* op) {
  return c10::make_intrusive<MpiStore>(Channel::open(comm, op), timeout);
}

c10::intrusive_ptr<c10d::Store> MpiStore::clone() {
  return c10::make_intrusive<MpiStore>(channel_, timeout_);
}

std::string MpiStore::error(Op op, const std::vector<std::string>& keys,
                            const std::string& what) const {
  const std::string call = std::string("store ") + opName(op);
  return opMessage(call.c_str(), channel_->rank(),
                   keys.empty() ? "" : c10::str("key(s) ", quoted(keys), ": "), what);
}

bool MpiStore::poll(int tag, std::vector<MPI_Request>& sends, std::vector<uint8_t>& reply) {
  bool got = false;
  const int me = channel_->rank();
  channel_->mpi("store call", [&] {
    for (auto& s : sends) {
      int done = 0;
      if (s != MPI_REQUEST_NULL)
        MPIGPU_MPI_CHECK(MPI_Test(&s, &done, MPI_STATUS_IGNORE), "store call", me);
    }
    got = receiveWhole(channel_->comm(), 0, tag, reply, "store call", me) >= 0;
  });
  return got;
}

void MpiStore::sendCancel(int tag, std::vector<MPI_Request>& sends, std::vector<uint8_t>& bytes) {
  Writer w;
  w.u8(static_cast<uint8_t>(Op::Cancel)).i64(0).i64(tag);
  bytes = std::move(w.bytes());
  sends.push_back(MPI_REQUEST_NULL);
  channel_->mpi("store call", [&] {
    MPIGPU_MPI_CHECK(MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0,
                               kRequestTag, channel_->comm(), &sends.back()),
                     "store call", channel_->rank());
  });
}

std::vector<uint8_t> MpiStore::call(Op op, const std::function<void(Writer&)>& fill,
                                    const std::vector<std::string>& keys,
                                    std::chrono::milliseconds timeout) {
  if (channel_->closed()) {
    C10_THROW_ERROR(DistStoreError, error(op, keys, "the MPI store was closed at exit"));
  }
  g_calls.fetch_add(1, std::memory_order_relaxed);
  const int tag = channel_->acquireTag();
  if (tag < 0) {
    C10_THROW_ERROR(DistStoreError, error(op, keys,
                                          c10::str("more than ", kReplyTags,
                                                   " store calls are in flight "
                                                   "in this process; wait for some to end")));
  }
  Writer request;
  request.u8(static_cast<uint8_t>(op)).i64(tag);
  fill(request);
  std::vector<MPI_Request> sends{MPI_REQUEST_NULL};
  channel_->mpi("store call", [&] {
    MPIGPU_MPI_CHECK(MPI_Isend(request.bytes().data(), static_cast<int>(request.bytes().size()),
                               MPI_BYTE, 0, kRequestTag, channel_->comm(), &sends[0]),
                     "store call", channel_->rank());
  });
  const auto reply = awaitReply(op, tag, keys, timeout, sends, request.bytes());
  // The server received every send of this call (it answered after them): they complete now.
  channel_->mpi("store call", [&] {
    MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE);
  });
  channel_->releaseTag(tag);
  Reader in(reply);
  const auto status = static_cast<Status>(in.u8());
  if (status == Status::Cancelled) {
    C10_THROW_ERROR(DistStoreError,
                    error(op, keys,
                          c10::str("not set within the store's timeout of ", timeout.count(),
                                   " ms. A rank that sets it has not "
                                   "reached that point, or has died (the launcher "
                                   "usually ends the job then). Raise the timeout "
                                   "(init_process_group(timeout=...)) if ranks start "
                                   "far apart")));
  }
  if (status == Status::Failed) C10_THROW_ERROR(DistStoreError, error(op, keys, in.str()));
  return std::vector<uint8_t>(reply.begin() + 1, reply.end());
}

std::vector<uint8_t> MpiStore::awaitReply(Op op, int tag, const std::vector<std::string>& keys,
                                          std::chrono::milliseconds timeout,
                                          std::vector<MPI_Request>& sends,
                                          std::vector<uint8_t>& request) {
  std::vector<uint8_t> cancel, reply;
  const auto start = Clock::now();
  auto deadline = timeout.count() > 0 ? start + timeout : Clock::time_point::max();
  auto pause = kFirstPause;
  while (!poll(tag, sends, reply)) {
    const auto now = Clock::now();
    if (now >= deadline) {
      if (!waits(op) || !cancel.empty()) {
        // Never answered: the tag stays taken, since a late reply could still come on it.
        abandon(*channel_, sends, request, cancel);
        C10_THROW_ERROR(DistStoreError, error(op, keys,
                                              c10::str("the store's server (rank 0 of the group's "
                                                       "communicator) did not answer within ",
                                                       timeout.count(),
                                                       " ms: it has died or is stuck "
                                                       "(its output says which)")));
      }
      sendCancel(tag, sends, cancel);
      deadline = now + kCancelWait;
    } else {
      // A caller holding the MPI mutex (a task of the shared engine) lets it go: this process's
      // own server may be the one to answer.
      mpi::OutsideMpi outside;
      if (now - start < kYieldFor) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kMaxPause);
      }
    }
  }
  return reply;
}

void MpiStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  call(Op::Set, [&](Writer& w) { w.str(key).blob(value); }, {key});
}

std::vector<uint8_t> MpiStore::compareSet(const std::string& key,
                                          const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  const auto r =
      call(Op::CompareSet, [&](Writer& w) { w.str(key).blob(expected).blob(desired); }, {key});
  return Reader(r).blob();
}

std::vector<uint8_t> MpiStore::get(const std::string& key) {
  const auto r = call(Op::Get, [&](Writer& w) { w.str(key); }, {key});
  return Reader(r).blob();
}

int64_t MpiStore::add(const std::string& key, int64_t value) {
  const auto r = call(Op::Add, [&](Writer& w) { w.str(key).i64(value); }, {key});
  return Reader(r).i64();
}

bool MpiStore::deleteKey(const std::string& key) {
  const auto r = call(Op::Delete, [&](Writer& w) { w.str(key); }, {key});
  return Reader(r).u8() != 0;
}

bool MpiStore::check(const std::vector<std::string>& keys) {
  const auto r = call(Op::Check, [&](Writer& w) { w.strs(keys); }, keys);
  return Reader(r).u8() != 0;
}

int64_t MpiStore::getNumKeys() {
  const auto r = call(Op::NumKeys, [](Writer&) {}, {});
  return Reader(r).i64();
}

void MpiStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void MpiStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  call(Op::Wait, [&](Writer& w) { w.strs(keys); }, keys, timeout);
}

void MpiStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  call(Op::Append, [&](Writer& w) { w.str(key).blob(value); }, {key});
}

std::vector<std::vector<uint8_t>> MpiStore::multiGet(const std::vector<std::string>& keys) {
  const auto r = call(Op::MultiGet, [&](Writer& w) { w.strs(keys); }, keys);
  Reader in(r);
  std::vector<std::vector<uint8_t>> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) values.push_back(in.blob());
  return values;
}

void MpiStore::multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::vector<uint8_t>>& values) {
  TORCH_CHECK_VALUE(
      keys.size() == values.size(),
      error(Op::MultiSet, keys,
            c10::str(keys.size(), " keys but ", values.size(), " values; give one value per key")));
  call(
      Op::MultiSet,
      [&](Writer& w) {
        w.strs(keys);
        for (const auto& v : values) w.blob(v);
      },
      keys);
}

std::vector<std::string> MpiStore::listKeys() {
  const auto r = call(Op::ListKeys, [](Writer&) {}, {});
  return Reader(r).strs();
}

}  // namespace mpigpu::store
