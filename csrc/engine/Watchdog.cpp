#include "engine/Watchdog.hpp"

#include "engine/FlightRecorder.hpp"
#include "engine/LauncherWatch.hpp"
#include "engine/ThreadName.hpp"
#include "mpi/Env.hpp"

#include <c10/util/Logging.h>
#include <mpi.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace mpigpu {
namespace {

using Clock = std::chrono::steady_clock;

struct Entry {
  Watchdog::Op op;
  Clock::time_point start;
  bool reported = false;
};

// A rank that left a group: how many collectives it had issued there, and how it left.
struct Departure {
  uint64_t issued = 0;
  std::string how;
  std::chrono::steady_clock::time_point seen;  // when this rank read it
};

struct Published {
  Watchdog::Progress progress;
  // The group's keys: its name and how many groups of that name this process has made before
  // (the same on every member), so a group made again under an old name never reads the old
  // group's keys from a store that outlived it.
  std::string keys;
  uint64_t lastPublished = ~uint64_t{0};
  // What the loop thread last read of the departures (only it touches these).
  int64_t departuresSeen = 0;
  std::map<int, Departure> departed;
  std::chrono::steady_clock::time_point lastDepartureCheck{};
};

std::string progressKey(const Published& p, int rank) { return p.keys + std::to_string(rank); }
std::string departuresKey(const Published& p) { return p.keys + "departures"; }

using Groups = std::vector<std::shared_ptr<Published>>;

// Every collective's watch scope takes State::mutex, so nothing slow runs under it: the loop takes
// a snapshot under the lock and does store I/O and stderr writes outside it (a store round-trip,
// or a store whose host is gone, must never delay a collective).
struct State {
  std::vector<std::shared_ptr<Published>> groups;
  Clock::time_point lastPublish;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<uint64_t, Entry> running;
  // Nodes of finished entries, reused: an op's watch costs no allocation (#68).
  std::vector<std::map<uint64_t, Entry>::node_type> spareNodes;
  std::map<std::string, uint64_t> groupsMade;  // by name, for Published::keys
  // Groups this rank destroyed while hosting their store's server: held, the store with them,
  // until every member has left (looked at about once a second), at most until exit, so that the
  // others' notices never meet a closed store.
  Groups hosting;
  std::vector<std::weak_ptr<Watchdog::Poller>> pollers;
  uint64_t nextId = 1;
  bool stop = false;
  std::thread thread;
};

State& state() {
  static State* s = new State();  // never destroyed: the thread may outlive static destructors
  return *s;
}

void publish(Published& p) {
  const uint64_t issued = p.progress.issued->load();
  if (issued == p.lastPublished) return;
  try {
    const std::string v = std::to_string(issued);
    p.progress.store->set(progressKey(p, p.progress.rank),
                          std::vector<uint8_t>(v.begin(), v.end()));
    p.lastPublished = issued;
  } catch (...) {
    // The store may be gone (its rank died): progress is a diagnostic, never a failure.
  }
}

// Tells the group's other ranks that this one left it, and how many collectives it had issued:
// the departure's number from one counter, then its record under that number (each reader reads
// only the departures it has not seen). Returns that number (how many have left), 0 if the store
// is gone.
int64_t announceDeparture(const Published& p, const char* how) {
  try {
    const int64_t n = p.progress.store->add(departuresKey(p), 1);
    const std::string v = std::to_string(p.progress.rank) + " " +
                          std::to_string(p.progress.issued->load()) + " " + how;
    p.progress.store->set(departuresKey(p) + "/" + std::to_string(n),
                          std::vector<uint8_t>(v.begin(), v.end()));
    return n;
  } catch (...) {
    // The store may be gone (its rank left first): then nobody is left to read it either.
    return 0;
  }
}

// Whether `store` is a TCPStore (under its prefixes): the one kind whose server goes when the
// process hosting it lets go (FileStore, HashStore: nothing closes).
bool isTcpStore(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> base = store;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(base.get())) {
    base = prefixed->getUnderlyingNonPrefixStore();
  }
  return dynamic_cast<const c10d::TCPStore*>(base.get()) != nullptr;
}

// Reads the departures not read yet: one store request when there are none.
void readDepartures(Published& p) {
  const int64_t count = p.progress.store->add(departuresKey(p), 0);
  while (p.departuresSeen < count) {
    const std::string k = departuresKey(p) + "/" + std::to_string(p.departuresSeen + 1);
    if (!p.progress.store->check({k})) return;  // counted, not written yet: read it next time
    const auto raw = p.progress.store->get(k);
    std::istringstream v(std::string(raw.begin(), raw.end()));
    int rank = -1;
    Departure d;
    d.seen = Clock::now();
    v >> rank >> d.issued;
    std::getline(v >> std::ws, d.how);
    p.departed[rank] = d;
    ++p.departuresSeen;
  }
}

// Which ranks of the stuck op's group have not issued it yet, from what they published.
std::string laggards(const Groups& groups, const Watchdog::Op& op) {
  for (const auto& g : groups) {
    Published& p = *g;
    if (p.progress.group != op.group || p.progress.rank != op.rank) continue;
    publish(p);
    std::ostringstream s;
    int behind = 0;
    try {
      for (int r = 0; r < p.progress.size; ++r) {
        if (r == op.rank) continue;
        const std::string k = progressKey(p, r);
        if (!p.progress.store->check({k})) {
          s << (behind++ ? ", " : "") << r << " (published nothing: no collective yet, or gone)";
          continue;
        }
        const auto raw = p.progress.store->get(k);
        const uint64_t issued = std::stoull(std::string(raw.begin(), raw.end()));
        if (issued < op.seq) {
          s << (behind++ ? ", " : "") << r << " (has issued " << issued << ")";
        }
      }
    } catch (const std::exception& e) {
      return std::string(" Could not read the other ranks' progress from the store: ") + e.what() +
             ".";
    }
    if (behind == 0) {
      return " Every other rank had issued this collective by its last report (about once a "
             "second): one may be stuck inside it, or blocked in another group.";
    }
    return " Ranks that had not issued collective #" + std::to_string(op.seq) +
           " at their last report (about once a second): " + s.str() + ".";
  }
  return "";
}

std::string report(const Groups& groups, const Entry& e, Clock::time_point now) {
  const auto ran = std::chrono::duration<double>(now - e.start).count();
  std::ostringstream s;
  s << "mpigpu WATCHDOG [rank " << e.op.rank << "]: " << e.op.name << " (collective #" << e.op.seq
    << " of group '" << e.op.group << "', " << e.op.bytes << " bytes on this rank"
    << (e.op.onCaller ? ", running on the calling thread" : "") << ") has been inside MPI for "
    << ran << " s, past its timeout of " << e.op.timeout.count() / 1000.0
    << " s. Some rank is not calling this op, or calls ops in a different order (run with "
       "TORCH_MPIGPU_DESYNC_CHECK=1 to compare every collective across ranks), or a rank has "
       "died.";
  s << laggards(groups, e.op) << " ";
  s << (e.op.abortOnTimeout ? "Ending the job (MPI_Abort); TORCH_MPIGPU_TIMEOUT_ACTION=report "
                              "only reports."
                            : "TORCH_MPIGPU_TIMEOUT_ACTION=report: the op keeps waiting.");
  return s.str();
}

// The flight recorder's dump on a timeout: the reporting rank writes its own and asks every
// other rank, through each of its groups' stores, to write theirs (their watchdogs look once a
// second), so that torch's analyzer gets one dump per rank. Each rank dumps once.
const std::string kDumpAsked = "mpigpu_flight_recorder/asked";
const std::string kDumped = "mpigpu_flight_recorder/dumped";
std::atomic<bool> g_dumped{false};

void dumpOnce(const Groups& groups, const std::string& why) {
  if (g_dumped.exchange(true)) return;
  const int worldRank = mpi::ensureInitialized().worldRank;
  const std::string where = fr::Recorder::get().write(worldRank);
  LOG(WARNING) << "mpigpu flight recorder [world rank " << worldRank << "]: " << why
               << "; this rank's record is in " << where
               << " (read every rank's with: python -m torch_mpi_gpu.frtrace <that folder>)";
  for (const auto& g : groups) {
    try {
      g->progress.store->add(kDumped, 1);
    } catch (...) {
      // The store may be gone: the dump itself is written.
    }
  }
}

// Looks at one store only, the first group's (the default group: every rank is in it, and the
// reporting rank asks through all of its groups), so a job with many groups does not send the
// store a request per group per second.
void dumpIfAsked(const Groups& groups) {
  if (g_dumped.load() || groups.empty() || !fr::Recorder::get().enabled()) return;
  const Published& first = *groups.front();
  try {
    if (first.progress.store->check({kDumpAsked})) {
      dumpOnce(groups, "another rank's watchdog reported a timeout (seen in group '" +
                           first.progress.group + "')");
    }
  } catch (...) {
    // The store may be gone (its rank died): nothing to be asked then.
  }
}

// Writes this rank's record, asks the others for theirs and, when the job is about to end, waits
// (up to 10 s) until every rank of the stuck op's group has written its own or exited (an exited
// rank's watchdog is stopped: it writes nothing).
void dumpJob(const Groups& groups, const Watchdog::Op& op, const std::string& why) {
  if (!fr::Recorder::get().enabled()) return;
  for (const auto& g : groups) {
    try {
      g->progress.store->set(kDumpAsked, std::vector<uint8_t>{1});
    } catch (...) {
    }
  }
  dumpOnce(groups, why + " in group '" + op.group + "'");
  if (!op.abortOnTimeout) return;
  for (const auto& g : groups) {
    if (g->progress.group != op.group || g->progress.rank != op.rank) continue;
    const auto until = Clock::now() + std::chrono::seconds(10);
    try {
      while (g->progress.store->add(kDumped, 0) + g->progress.store->add(departuresKey(*g), 0) <
                 g->progress.size &&
             Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } catch (...) {
    }
  }
}

// A collective that has waited this long looks for ranks that left its group before issuing it.
constexpr auto kDepartureGrace = std::chrono::seconds(1);

struct Waiting {
  uint64_t id;
  Entry entry;
};

// Which ranks left `p`'s group before issuing collective #seq, or, for a point-to-point op, the
// peer if it left (from departures already read), judged a second after its departure was read,
// so that a message it sent before it left has had time to arrive (collectives go by count).
std::string leftBefore(const Published& p, const Watchdog::Op& op, Clock::time_point now,
                       int* count) {
  std::ostringstream s;
  for (const auto& [rank, d] : p.departed) {
    if (rank == p.progress.rank) continue;
    if (op.peer >= 0 ? rank != op.peer || now - d.seen < kDepartureGrace : d.issued >= op.seq) {
      continue;
    }
    s << ((*count)++ ? "; " : "") << "rank " << rank << " left the group after issuing " << d.issued
      << " collective(s) in it: it " << d.how;
  }
  return s.str();
}

std::string departureReport(const Entry& e, const std::string& who) {
  std::ostringstream s;
  s << "mpigpu WATCHDOG [rank " << e.op.rank << "]: " << e.op.name;
  if (e.op.peer >= 0) {
    s << " (point-to-point op #" << e.op.seq << " with rank " << e.op.peer;
  } else {
    s << " (collective #" << e.op.seq;
  }
  s << " of group '" << e.op.group << "', " << e.op.bytes << " bytes on this rank) can never "
    << "finish: " << who << ". "
    << (e.op.peer >= 0 ? "A rank must not leave a group while another still sends to it or "
                         "receives from it"
                       : "Every rank of a group must issue the same collectives before any of "
                         "them exits or destroys the group")
    << " (an early sys.exit, return or destroy_process_group on some ranks; ranks given different "
       "numbers of batches: DDP's join() context manager handles uneven inputs). "
    << (e.op.abortOnTimeout ? "Ending the job (MPI_Abort) now rather than at the op's timeout; "
                              "TORCH_MPIGPU_TIMEOUT_ACTION=report only reports."
                            : "TORCH_MPIGPU_TIMEOUT_ACTION=report: the op keeps waiting.");
  return s.str();
}

// Reads each waiting op's group's departures (at most once a second per group) and reports, then
// ends the job for, an op that waits for a rank that left before issuing it.
void judgeDepartures(const Groups& groups, const std::vector<Waiting>& waiting,
                     Clock::time_point now) {
  State& st = state();
  for (const auto& w : waiting) {
    for (const auto& g : groups) {
      Published& p = *g;
      if (p.progress.group != w.entry.op.group || p.progress.rank != w.entry.op.rank) continue;
      if (now - p.lastDepartureCheck >= kDepartureGrace) {
        p.lastDepartureCheck = now;
        try {
          readDepartures(p);
        } catch (...) {
          // The store may be gone: the timeout still reports the op.
        }
      }
      int gone = 0;
      const std::string who = leftBefore(p, w.entry.op, now, &gone);
      if (gone == 0) continue;
      {
        std::lock_guard<std::mutex> lock(st.mutex);
        const auto it = st.running.find(w.id);
        if (it == st.running.end() || it->second.reported) continue;  // finished meanwhile
        it->second.reported = true;
      }
      LOG(ERROR) << departureReport(w.entry, who);
      dumpJob(groups, w.entry.op, "a rank left before issuing an op");
      if (w.entry.op.abortOnTimeout && !mpi::isFinalized()) mpi::abortJob(3);
    }
  }
}

// Lets go of the destroyed groups (`held`, a snapshot of State::hosting taken about once a second)
// whose every member has left: this rank's store server may close with the last of them.
void releaseWhenAllLeft(const Groups& held) {
  State& st = state();
  Groups done;
  for (const auto& g : held) {
    try {
      if (g->progress.store->add(departuresKey(*g), 0) < g->progress.size) continue;
    } catch (...) {
      // unreadable (not while this process holds the server): holding it helps nobody then
    }
    done.push_back(g);
  }
  if (done.empty()) return;
  std::lock_guard<std::mutex> lock(st.mutex);
  auto& h = st.hosting;
  h.erase(std::remove_if(h.begin(), h.end(),
                         [&](const std::shared_ptr<Published>& g) {
                           return std::find(done.begin(), done.end(), g) != done.end();
                         }),
          h.end());
}  // (`done` goes after the lock: a store server's shutdown joins its thread)

void loop() {
  setThreadName("mpigpu-watchdog");
  State& st = state();
  while (true) {
    Groups groups, toPublish, held;
    std::vector<Entry> due;
    std::vector<Waiting> waiting;
    std::vector<std::shared_ptr<Watchdog::Poller>> pollers;
    Clock::time_point now;
    {
      std::unique_lock<std::mutex> lock(st.mutex);
      st.cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return st.stop; });
      if (st.stop) return;
      now = Clock::now();
      auto& w = st.pollers;
      w.erase(std::remove_if(w.begin(), w.end(), [](const auto& p) { return p.expired(); }),
              w.end());
      for (const auto& p : w)
        if (auto live = p.lock()) pollers.push_back(std::move(live));
      groups = st.groups;
      if (now - st.lastPublish > std::chrono::seconds(1)) {
        toPublish = st.groups;
        held = st.hosting;
        st.lastPublish = now;
      }
      for (auto& [id, e] : st.running) {
        if (e.reported || now - e.start < kDepartureGrace) continue;
        if (e.op.awaited && !e.op.awaited->load(std::memory_order_relaxed)) continue;
        if (e.op.peer >= 0 || now - e.start < e.op.timeout) {  // (p2p: wait() has the timeout)
          waiting.push_back({id, e});
          continue;
        }
        e.reported = true;
        due.push_back(e);
      }
    }
    endRankIfLauncherGone();
    for (const auto& p : pollers) p->poll();
    pollers.clear();  // (outside the lock: the last owner may be this thread)
    judgeDepartures(groups, waiting, now);
    if (!held.empty()) releaseWhenAllLeft(held);
    for (const auto& p : toPublish) publish(*p);
    if (!toPublish.empty()) dumpIfAsked(toPublish);
    for (const auto& e : due) {
      LOG(ERROR) << report(groups, e, now);
      dumpJob(groups, e.op, "timeout");
      if (e.op.abortOnTimeout && !mpi::isFinalized()) mpi::abortJob(3);
    }
  }
}

// The watchdog's thread, started by the first caller that needs it (under st.mutex).
void startLocked(State& st) {
  if (!st.thread.joinable() && !st.stop) st.thread = std::thread(loop);
}

}  // namespace

void Watchdog::addPoller(std::weak_ptr<Poller> poller) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  startLocked(st);
  st.pollers.push_back(std::move(poller));
}

void Watchdog::addGroup(Progress p) {
  noteLauncher();  // (watched from now: see LauncherWatch.hpp)
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  startLocked(st);
  auto published = std::make_shared<Published>();
  published->keys =
      "mpigpu_watchdog/" + p.group + "/" + std::to_string(st.groupsMade[p.group]++) + "/";
  published->progress = std::move(p);
  st.groups.push_back(std::move(published));
}

namespace {
// Stops watching the group; null if it is not watched (announced at exit already, or never).
std::shared_ptr<Published> takeGroup(const std::string& group, int rank) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  const auto it = std::find_if(st.groups.begin(), st.groups.end(), [&](const auto& p) {
    return p->progress.group == group && p->progress.rank == rank;
  });
  if (it == st.groups.end()) return nullptr;
  auto taken = *it;
  st.groups.erase(it);
  return taken;
}
}  // namespace

void Watchdog::removeGroup(const std::string& group, int rank) { takeGroup(group, rank); }

void Watchdog::leaveGroup(const std::string& group, int rank, bool hostsStore) {
  State& st = state();
  std::shared_ptr<Published> left = takeGroup(group, rank);
  if (!left) return;
  const int64_t gone = announceDeparture(*left, "called destroy_process_group");
  if (!hostsStore || gone <= 0 || gone >= left->progress.size) return;
  if (!isTcpStore(left->progress.store)) return;
  std::lock_guard<std::mutex> lock(st.mutex);
  st.hosting.push_back(std::move(left));
}

void Watchdog::releaseHeldStores() {
  State& st = state();
  Groups held;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    held.swap(st.hosting);
  }
}

void Watchdog::announceExit() {
  State& st = state();
  Groups left;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    left.swap(st.groups);
  }
  for (const auto& p : left) {
    announceDeparture(*p, "exited (its interpreter ended: sys.exit, or the end of the script)");
  }
}

Watchdog::Scope::Scope(Op op) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  startLocked(st);
  id_ = st.nextId++;
  Entry entry{std::move(op), Clock::now(), false};
  if (st.spareNodes.empty()) {
    st.running.emplace(id_, std::move(entry));
    return;
  }
  auto node = std::move(st.spareNodes.back());
  st.spareNodes.pop_back();
  node.key() = id_;
  node.mapped() = std::move(entry);
  st.running.insert(std::move(node));
}

Watchdog::Scope::~Scope() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  auto node = st.running.extract(id_);
  if (!node.empty() && st.spareNodes.size() < 16) st.spareNodes.push_back(std::move(node));
}

void Watchdog::stop() {
  State& st = state();
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    st.stop = true;
  }
  st.cv.notify_all();
  if (st.thread.joinable()) st.thread.join();
}

}  // namespace mpigpu
