// Where the MPI store's messages travel: a duplicate of the communicator the group meets on (so
// they never match the program's messages or mpigpu's collectives), its rank 0 running the
// store's server (StoreServer).
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store/Wire.hpp"

namespace mpigpu::store {

class StoreServer;

class Channel {
 public:
  // Collective over `source`: duplicates it; its rank 0 starts the server. `op` names the call
  // in errors (init_process_group). Below MPI_THREAD_MULTIPLE, on the shared engine's thread.
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

  // Runs `fn` (MPI calls that never block) holding the MPI mutex below MPI_THREAD_MULTIPLE
  // (mpi::SerialGuard). Every MPI call of the store's callers goes through here.
  void mpi(const char* what, const std::function<void()>& fn);

  // A reply tag no other request of this process is using; -1 when all are in use.
  int acquireTag();
  void releaseTag(int tag);

 private:
  void close();

  MPI_Comm comm_;
  const int rank_, size_;
  mutable std::mutex mutex_;  // freeTags_, closed_
  std::vector<int> freeTags_;
  bool closed_ = false;
  std::unique_ptr<StoreServer> server_;
};

}  // namespace mpigpu::store
