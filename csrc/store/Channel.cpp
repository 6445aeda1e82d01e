#include "store/Channel.hpp"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <thread>

#include "core/Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Env.hpp"
#include "mpi/Wait.hpp"
#include "store/StoreServer.hpp"
#include "store/Wire.hpp"

namespace mpigpu::store {

namespace {
// At exit, how long a server waits for the other ranks of its channel to close their stores (to
// reach exit): a rank still working may yet call the store. MPI_Finalize waits for them as well.
constexpr auto kByeWait = std::chrono::seconds(300);

std::mutex g_channelsMutex;
std::vector<std::shared_ptr<Channel>> g_channels;  // open channels, closed at exit
}  // namespace

std::shared_ptr<Channel> Channel::open(MPI_Comm source, const char* op) {
  const auto& env = mpi::ensureInitialized();
  const int worldRank = env.worldRank;
  MPI_Comm dup = MPI_COMM_NULL;
  int rank = 0, size = 1;
  // Serialized (on the shared engine's thread, csrc/init.cpp onMpiThread): the blocking dup
  // starts once every rank is here, so no rank waits inside it for one that waits for a store.
  mpi::SerialGuard inMpi;
  if (mpi::serialized()) mpi::arriveOn(source, op, worldRank);
  MPIGPU_MPI_CHECK(MPI_Comm_dup(source, &dup), op, worldRank);
  MPIGPU_MPI_CHECK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), op, worldRank);
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  auto channel = std::make_shared<Channel>(dup, rank, size);
  std::lock_guard<std::mutex> lock(g_channelsMutex);
  g_channels.push_back(channel);
  return channel;
}

void Channel::closeAll() {
  std::vector<std::shared_ptr<Channel>> channels;
  {
    std::lock_guard<std::mutex> lock(g_channelsMutex);
    channels.swap(g_channels);
  }
  for (const auto& c : channels) c->close();
}

Channel::Channel(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {
  freeTags_.reserve(kReplyTags);
  for (int t = kFirstReplyTag + kReplyTags - 1; t >= kFirstReplyTag; --t) freeTags_.push_back(t);
  if (rank_ == 0) server_ = std::make_unique<StoreServer>(comm_, size_);
}

// The duplicate communicator stays until MPI_Finalize: freeing it is collective, and the job may
// have ended elsewhere by the time this process lets go of it.
Channel::~Channel() {
  if (server_) server_->stopAndJoin(Clock::now());
}

bool Channel::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

void Channel::mpi(const char*, const std::function<void()>& fn) {
  mpi::SerialGuard inMpi;  // (serialized: beside the engine's calls, mpi/Wait.hpp)
  fn();
}

int Channel::acquireTag() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (freeTags_.empty()) return -1;
  const int tag = freeTags_.back();
  freeTags_.pop_back();
  return tag;
}

void Channel::releaseTag(int tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  freeTags_.push_back(tag);
}

// Bye to the server (after every earlier request of this rank: MPI keeps the order of one
// sender's messages on one communicator and tag), then, on rank 0, the server stops once every
// rank has said it.
void Channel::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
  }
  static auto* byes = new std::vector<std::vector<uint8_t>>();  // MPI may read them until exit
  Writer bye;
  bye.u8(static_cast<uint8_t>(Op::Bye)).i64(0);
  byes->push_back(std::move(bye.bytes()));
  const auto& bytes = byes->back();
  MPI_Request request = MPI_REQUEST_NULL;
  const auto until = Clock::now() + kByeWait;
  try {
    mpi("store close", [&] {
      MPIGPU_MPI_CHECK(MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0,
                                 kRequestTag, comm_, &request),
                       "store close", rank_);
    });
    int done = 0;
    // (rank 0 lets its own Bye go: its server receives it while it runs on)
    while (!server_ && !done && Clock::now() < until) {
      mpi("store close", [&] { MPI_Test(&request, &done, MPI_STATUS_IGNORE); });
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!done) mpi("store close", [&] { MPI_Request_free(&request); });
  } catch (const std::exception& e) {
    LOG(WARNING) << opMessage("store close", rank_, e.what());
  }
  if (server_) server_->stopAndJoin(until);
}

}  // namespace mpigpu::store
