// What MPI, or a thread stuck inside MPI, may still use after an error (the buffer of a request
// freed unfinished, a stuck engine, an op's completion holding staging buffers): kept until the
// process ends and never freed, so nothing writes into memory someone else owns by then. Rare and
// small: only after failed or aborted ops.
#pragma once

#include <mutex>
#include <utility>
#include <vector>

namespace mpigpu {

template <typename T>
void keepUntilExit(T value) {
  static std::mutex mutex;  // groups fail their outstanding ops from several threads at once
  static auto* kept = new std::vector<T>();  // never destroyed: not even at static teardown
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(value));
}

}  // namespace mpigpu
