// The MPI store's server, on rank 0 of its channel: one thread holding the keys, answering each
// request over the channel's communicator. Requests that wait (get, wait, multi_get) are kept
// until their keys exist and answered then, so no client polls the server for a key.
//
// Finding requests: MPI_Improbe + MPI_Mrecv on the request tag (a message of any size, and no
// receive left posted that would have to be cancelled at exit). In a burst (a request within
// kBurstGap of the one before: start-up, a barrier, a loop of calls) the thread yields between
// checks for kYieldAfterRequest after a request; otherwise, and after that, it sleeps on a
// condition variable, growing from kFirstSleep to kBusyCap while requests came within
// kBusyWindow, then to kIdleCap. Isolated requests (each rank's watchdog, a few a second) so
// cost no yielding: the thread stays off the cores a waiting rank needs. A blocking
// MPI_Mprobe would keep a core spinning for the whole job in Open MPI and MPICH, and no portable
// MPI call waits without spinning.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "store/Wire.hpp"

namespace mpigpu::store {

constexpr auto kBurstGap = std::chrono::milliseconds(2);
constexpr auto kYieldAfterRequest = std::chrono::microseconds(200);
constexpr auto kFirstSleep = std::chrono::microseconds(20);
constexpr auto kBusyCap = std::chrono::microseconds(1000);
constexpr auto kIdleCap = std::chrono::milliseconds(10);
constexpr auto kBusyWindow = std::chrono::milliseconds(20);

class StoreServer {
 public:
  // Serves requests on `comm` (the channel's duplicate; this process is its rank 0 of `size`).
  StoreServer(MPI_Comm comm, int size);
  ~StoreServer();
  // Stop once every rank of the channel said Bye, or at `deadline` (then a warning names the
  // ranks that did not); returns when the thread has ended.
  void stopAndJoin(Clock::time_point deadline);

 private:
  struct Waiter {
    Op op;
    std::vector<std::string> keys;
  };
  using WaiterId = std::pair<int, int>;  // (source rank, reply tag)

  void loop();
  bool serveOnce();  // holding the MPI mutex (mpi::SerialGuard); true when a request came
  void handle(int source, const std::vector<uint8_t>& bytes);
  void handleWrite(Op op, int source, int tag, Reader& in);
  void handleRead(Op op, int source, int tag, Reader& in);
  void handleWaiting(Op op, int source, int tag, Reader& in);
  void handleBye(int source);
  void reply(int source, int tag, Writer& out);
  void fail(int source, int tag, const std::string& why);
  bool ready(const Waiter& w) const;
  void answer(const WaiterId& id, const Waiter& w);
  void parkUnder(const WaiterId& id, const Waiter& w);
  void keyWritten(const std::string& key);
  void testSends();
  bool finished();
  void releaseSends();

  const MPI_Comm comm_;
  const int size_;
  // Touched only by the server thread (inside serveOnce, one pass at a time).
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
  std::map<WaiterId, Waiter> waiters_;
  std::unordered_map<std::string, std::vector<WaiterId>> parked_;  // by the first missing key
  std::set<int> byes_;
  struct Send {
    std::vector<uint8_t> bytes;
    MPI_Request request;
  };
  std::list<Send> sends_;  // replies MPI may still be sending
  std::vector<uint8_t> buffer_;

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  Clock::time_point stopDeadline_;
  std::thread thread_;
};

}  // namespace mpigpu::store
