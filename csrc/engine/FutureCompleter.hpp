// Completes Work futures off the engine thread. Future callbacks run inside markCompleted(), and
// some wait on another op of the same group (PowerSGD's hook does); run on the engine thread that
// would deadlock. The pool grows whenever every thread is busy, so a blocked callback never
// starves the completion it waits for; idle threads exit.
#pragma once

#include <functional>

namespace mpigpu {

void completeFutureAsync(std::function<void()> fn);
// Waits for queued completions and stops the threads (at exit, before MPI_Finalize).
void stopFutureCompleter();

}  // namespace mpigpu
