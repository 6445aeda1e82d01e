#include "engine/FutureCompleter.hpp"
#include "engine/ThreadName.hpp"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace mpigpu {
namespace {

struct Pool {
  std::mutex mutex;
  std::condition_variable cv, drained;
  std::deque<std::function<void()>> queue;
  int threads = 0, idle = 0;
  bool stopping = false;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: threads may outlive static destruction order
  return *p;
}

void worker() {
  setThreadName("mpigpu-future");
  Pool& p = pool();
  std::unique_lock<std::mutex> lock(p.mutex);
  while (true) {
    ++p.idle;
    bool woke = p.cv.wait_for(lock, std::chrono::seconds(2),
                              [&] { return !p.queue.empty() || p.stopping; });
    --p.idle;
    if (!woke || (p.queue.empty() && p.stopping)) break;
    auto fn = std::move(p.queue.front());
    p.queue.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
  if (--p.threads == 0) p.drained.notify_all();
}

}  // namespace

void completeFutureAsync(std::function<void()> fn) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.stopping) {
    fn();  // at exit: nobody else will run it
    return;
  }
  p.queue.push_back(std::move(fn));
  if (p.idle < static_cast<int>(p.queue.size())) {
    ++p.threads;
    std::thread(worker).detach();
  } else {
    p.cv.notify_one();
  }
}

void stopFutureCompleter() {
  Pool& p = pool();
  std::unique_lock<std::mutex> lock(p.mutex);
  p.stopping = true;
  p.cv.notify_all();
  p.drained.wait_for(lock, std::chrono::seconds(10), [&] { return p.threads == 0; });
}

}  // namespace mpigpu
