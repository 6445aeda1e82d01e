// Where the MPI store's messages travel: a duplicate of the communicator the group meets on (so
// they never match the program's messages or mpigpu's collectives), its rank 0 running the
// store's server (StoreServer). Every MPI call of the store goes through Channel::mpi, which keeps
// to the thread level MPI granted.
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mpigpu {
class Engine;
}

namespace mpigpu::store {

using Clock = std::chrono::steady_clock;
class StoreServer;

class Channel {
 public:
  // Collective over `source`: duplicates it; its rank 0 starts the server. `op` names the call
  // in errors (init_process_group).
  static std::shared_ptr<Channel> open(MPI_Comm source, const char* op);
  // At exit, before MPI_Finalize: every open channel says Bye to its server, and each server
  // stops once every rank of its channel has (bounded, see kByeWait).
  static void closeAll();

  Channel(MPI_Comm comm, int rank, int size);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool closed() const;

  // Runs `fn` (MPI calls that never block) where this process may call MPI now: on the calling
  // thread with MPI_THREAD_MULTIPLE; below it on the shared MPI thread (Engine::runAndWait), and
  // waits until it ran there (`fn` refers to the caller's stack; the thread may be inside a
  // blocking collective meanwhile); after the engines stopped at exit, on the calling thread, one
  // thread at a time. Throws when the shared MPI thread was stopped or aborted.
  void mpi(const char* what, const std::function<void()>& fn);

  // A reply tag no other request of this process is using; -1 when all are in use.
  int acquireTag();
  void releaseTag(int tag);

 private:
  void close();

  MPI_Comm comm_;
  const int rank_, size_;
  const bool serialized_;
  mutable std::mutex mutex_;  // freeTags_, closed_, engine_
  std::vector<int> freeTags_;
  bool closed_ = false;
  std::shared_ptr<Engine> engine_;
  std::unique_ptr<StoreServer> server_;
};

}  // namespace mpigpu::store
