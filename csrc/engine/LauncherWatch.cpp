#include "engine/LauncherWatch.hpp"

#include <c10/util/StringUtil.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include "mpi/Env.hpp"

namespace mpigpu {
namespace {

struct Launcher {
  int pid = 0;
  std::string name;  // its command name (/proc/<pid>/comm), "" if unreadable
};

struct Watch {
  int leader = 0;     // this process group's leader: this process, or a wrapper above it
  Launcher launcher;  // the leader's parent when noted
  int worldRank = 0;
};
std::once_flag g_noted;
std::atomic<const Watch*> g_watch{nullptr};  // set once, kept until exit

// The parent of process `pid` (field 4 of /proc/<pid>/stat, after the command name in
// parentheses, which may itself hold spaces and parentheses); -1 once `pid` is gone.
int parentOf(int pid) {
  if (pid == static_cast<int>(getpid())) return static_cast<int>(getppid());
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  char line[512] = {0};
  const bool read = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  const char* afterName = read ? std::strrchr(line, ')') : nullptr;
  int parent = -1;
  if (afterName == nullptr || std::sscanf(afterName + 1, " %*c %d", &parent) != 1) return -1;
  return parent;
}

std::string commandName(int pid) {
  std::string name;
  if (FILE* f = std::fopen(c10::str("/proc/", pid, "/comm").c_str(), "r")) {
    char line[64] = {0};
    if (std::fgets(line, sizeof line, f)) name = line;
    std::fclose(f);
  }
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

// Whether process `pid` started with this process's rank variable (the first of the launchers'
// that this process has): a wrapper the launcher started for this rank has it; a launcher that
// left its ranks in its own process group (none here does) has not, and is no wrapper.
bool startedForThisRank(int pid) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* mine = std::getenv(name);
    if (mine == nullptr) continue;
    std::ifstream file(c10::str("/proc/", pid, "/environ"), std::ios::binary);
    const std::string wanted = c10::str(name, "=", mine);
    for (std::string entry; std::getline(file, entry, '\0');) {
      if (entry == wanted) return true;
    }
    return false;
  }
  return false;
}

}  // namespace

void noteLauncher() {
  std::call_once(g_noted, [] {
    const auto& env = mpi::ensureInitialized();
    if (env.worldSize <= 1) return;
    const int self = static_cast<int>(getpid());
    const int group = static_cast<int>(getpgrp());
    int leader = self;
    // a wrapper above this process: the group's leader among its ancestors, a few steps up
    for (int p = static_cast<int>(getppid()), steps = 0; group != self && p > 1 && steps < 16;
         p = parentOf(p), ++steps) {
      if (p == group) {
        if (startedForThisRank(p)) leader = p;
        break;
      }
    }
    const int launcher = parentOf(leader);
    if (launcher <= 1) return;
    g_watch.store(new Watch{leader, Launcher{launcher, commandName(launcher)}, env.worldRank},
                  std::memory_order_release);
  });
}

void endRankIfLauncherGone() {
  const Watch* w = g_watch.load(std::memory_order_acquire);
  if (w == nullptr || parentOf(w->leader) == w->launcher.pid) return;
  const Launcher& launcher = w->launcher;
  const std::string who = launcher.name.empty() ? c10::str("pid ", launcher.pid)
                                                : c10::str(launcher.name, ", pid ", launcher.pid);
  const std::string line = c10::str(
      "mpigpu [rank ", w->worldRank, "]: the launcher's process that started this rank (", who,
      ") has gone, killed it seems (SIGKILL, the OOM killer): nothing is left to end the job "
      "or read its output, so this rank ends itself (exit 3). To stop a job, send Ctrl-C or "
      "SIGTERM to the launcher; a SIGKILL leaves Open MPI's session folder behind "
      "(docs/troubleshooting.md).\n");
  // the reader of a launcher's pipe is gone: a write fails (EPIPE: Python ignores SIGPIPE), but
  // stderr may be a file or a terminal
  (void)!write(STDERR_FILENO, line.data(), line.size());
  std::_Exit(3);
}

}  // namespace mpigpu
