// The group's life: creation (communicators, agreed GPU presence, watchdog registration),
// description, timeout, and its end (shutdown, abort, destruction).
#include "ProcessGroupMPIGPU.hpp"

#include <c10/util/Logging.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/Errors.hpp"
#include "core/KeepUntilExit.hpp"
#include "algorithms/NodeAlgorithms.hpp"
#include "engine/FlightRecorder.hpp"
#include "engine/Watchdog.hpp"
#include "mpi/Check.hpp"
#include "mpi/Env.hpp"
#include "mpi/FaultTolerance.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu {

using std::chrono::milliseconds;

namespace {

// FNV-1a of the shared settings: the same text gives the same digest on every rank; shifted to
// be non-negative, so that its negation fits (one MAX reduction yields both extremes).
int64_t digestOf(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return static_cast<int64_t>(h >> 2);
}

// "0, 2-4": ranks in ascending order, runs joined.
std::string rankRuns(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? std::to_string(ranks[i]) : c10::str(ranks[i], "-", ranks[j]);
    i = j + 1;
  }
  return out;
}

// Each shared setting whose value differs between the ranks (`byRank`: each rank's
// sharedSettings lines), with every value and the ranks holding it.
std::string settingsThatDiffer(const std::vector<std::string>& byRank) {
  std::vector<std::string> names;  // in the table's order
  std::map<std::string, std::map<std::string, std::vector<int>>> ranksByValue;
  for (int r = 0; r < static_cast<int>(byRank.size()); ++r) {
    std::istringstream lines(byRank[r]);
    for (std::string line; std::getline(lines, line);) {
      const auto eq = line.find('=');
      const std::string name = line.substr(0, eq);
      if (ranksByValue.count(name) == 0) names.push_back(name);
      ranksByValue[name][eq == std::string::npos ? "" : line.substr(eq + 1)].push_back(r);
    }
  }
  std::string out;
  for (const auto& name : names) {
    const auto& values = ranksByValue[name];
    size_t holders = 0;
    for (const auto& [value, ranks] : values) holders += ranks.size();
    if (values.size() < 2 && holders == byRank.size()) continue;
    std::string each;
    for (const auto& [value, ranks] : values) {
      each += c10::str(each.empty() ? "" : ", ", "`", value, "` on rank",
                       ranks.size() > 1 ? "s " : " ", rankRuns(ranks));
    }
    out += c10::str(out.empty() ? "" : "; ", name, " is ", each);
  }
  return out;
}

// The members' ranks in the job communicator (mpi/Env.hpp: MPI_COMM_WORLD, or the program's own
// communicator the default group was made over), which are torch's global ranks.
std::vector<int> resolveJobRanks(int rank, int size, const std::vector<int64_t>& globalRanks) {
  const auto& env = mpi::ensureInitialized();
  const mpi::JobComm job = mpi::jobComm();
  const char* op = "init_process_group";
  if (globalRanks.empty()) {
    if (job.size == 1 && size > 1) {
      MPIGPU_THROW_BACKEND(op, rank,
                           "this process is not part of a multi-process MPI job (MPI "
                           "world size 1, store world size ",
                           size,
                           "). mpigpu needs an MPI "
                           "launcher: run `mpirun -np ",
                           size,
                           " python your_script.py` (or srun/"
                           "mpiexec) instead of torchrun or manual RANK/WORLD_SIZE");
    }
    if (job.size != size || job.rank != rank) {
      MPIGPU_THROW_BACKEND(op, rank, "the store's rank/world size (", rank, "/", size,
                           ") disagree with MPI's (", job.rank, "/", job.size,
                           "). Let torch_mpi_gpu set RANK/WORLD_SIZE from the MPI launcher (unset "
                           "them), or pass rank=MPI rank and world_size=MPI size; over a "
                           "communicator of your own, use torch_mpi_gpu.init_process_group(comm=)");
    }
    std::vector<int> all(size);
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  MPIGPU_CHECK_VALUE(static_cast<int>(globalRanks.size()) == size, "new_group", rank,
                     "group of size ", size, " got ", globalRanks.size(), " global ranks");
  std::vector<int> ranks;
  for (int64_t g : globalRanks) {
    MPIGPU_CHECK_VALUE(g >= 0 && g < job.size, "new_group", rank, "global rank ", g,
                       " is not in the default group (size ", job.size, ")");
    ranks.push_back(static_cast<int>(g));
  }
  if (ranks[rank] != job.rank) {
    MPIGPU_THROW_BACKEND("new_group", rank, "group rank ", rank, " is global rank ", ranks[rank],
                         " but this process is rank ", job.rank,
                         " of the default group's MPI communicator (MPI_COMM_WORLD rank ",
                         env.worldRank,
                         "); the default group's ranks must equal its "
                         "communicator's ranks");
  }
  return ranks;
}

// "[0, 2]"
std::string bracketed(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += c10::str(out.empty() ? "" : ", ", r);
  return "[" + out + "]";
}

// ULFM: Engine::runAndWait's `peerFailed` for making a communicator among `members` (ranks of
// `parent`; empty: all of them): why to give up once one of them has been known failed for
// kFailedGrace (the time MPI's own call takes to fail, where it does). nullptr without ULFM.
std::function<std::string()> givingUpOnFailed(MPI_Comm parent, std::vector<int> members,
                                              std::string what) {
  constexpr auto kFailedGrace = std::chrono::seconds(1);
  if (!mpi::ft::active() || mpi::needsSerializedAccess()) return nullptr;
  auto seen = std::make_shared<std::optional<std::chrono::steady_clock::time_point>>();
  return [=]() -> std::string {
    std::vector<int> dead = mpi::ft::failedRanks(parent);
    if (!members.empty())
      dead.erase(
          std::remove_if(
              dead.begin(), dead.end(),
              [&](int r) { return std::find(members.begin(), members.end(), r) == members.end(); }),
          dead.end());
    const auto now = std::chrono::steady_clock::now();
    if (dead.empty() || !*seen) {
      if (!dead.empty()) *seen = now;
      return {};
    }
    if (now - **seen < kFailedGrace) return {};
    return c10::str(dead.size() > 1 ? "ranks " : "rank ", bracketed(dead), " of ", what,
                    " failed while it was being made, and MPI does not return from making a "
                    "communicator with a failed member: it was not made. Call "
                    "torch.distributed.shrink_group(ranks_to_exclude=<the failed ranks>) on every "
                    "survivor (the default group too), then make groups from the shrunk one");
  };
}

#if MPIGPU_TORCH_HAS_SHRINK

// The failed ranks of `comm` once every rank of `excluded` is among them, waiting up to 2 s (a
// rank may hear of a failure a moment after its peers); *live: an excluded rank still not
// known failed then (-1: none).
std::vector<int> awaitFailed(MPI_Comm comm, const std::vector<int64_t>& excluded, int* live) {
  std::vector<int> dead = mpi::ft::failedRanks(comm);
  auto liveOne = [&] {
    for (int64_t r : excluded)
      if (!std::binary_search(dead.begin(), dead.end(), static_cast<int>(r)))
        return static_cast<int>(r);
    return -1;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (liveOne() >= 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
    dead = mpi::ft::failedRanks(comm);
  }
  *live = liveOne();
  return dead;
}

struct Survivors {
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<int> members;  // the survivors' ranks in the parent
  bool agreed = false;
};

// On an engine: MPIX_Comm_shrink of `parent`, whose members must be `stayRanks` on every
// survivor (agreed over the result); the default group's becomes the job communicator.
void shrinkParent(MPI_Comm parent, const std::vector<int>& stayRanks, bool isDefault,
                  const char* op, int rank, Survivors* out) {
  out->comm = mpi::ft::shrink(parent, op, rank);
  int n = 0;
  MPI_Comm_size(out->comm, &n);
  MPI_Group shrunk = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  MPI_Comm_group(out->comm, &shrunk);
  MPI_Comm_group(parent, &all);
  std::vector<int> in(n);
  std::iota(in.begin(), in.end(), 0);
  out->members.assign(n, MPI_UNDEFINED);
  MPI_Group_translate_ranks(shrunk, n, in.data(), all, out->members.data());
  MPI_Group_free(&shrunk);
  MPI_Group_free(&all);
  int same = out->members == stayRanks ? 1 : 0;
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, out->comm), op, rank);
  out->agreed = same != 0;
  if (out->agreed && isDefault) mpi::useJobComm(out->comm);
  if (!out->agreed) mpi::freeComm(&out->comm);
}
#endif

// ULFM: failures are also looked for every watchdog poll (mpi::ft::pollFailures), not only when
// a call fails: some MPI waits never end on a peer's failure.
void watchFailures() {
  if (!mpi::ft::active() || mpi::needsSerializedAccess()) return;
  static std::once_flag once;
  std::call_once(once, [] {
    struct FailurePoller final : Watchdog::Poller {
      void poll() override { mpi::ft::pollFailures(); }
    };
    auto poller = std::make_shared<FailurePoller>();
    Watchdog::addPoller(poller);
    keepUntilExit(std::shared_ptr<Watchdog::Poller>(std::move(poller)));  // the watchdog's is weak
  });
}

}  // namespace

ProcessGroupMPIGPU::ProcessGroupMPIGPU(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                       std::vector<int64_t> globalRanks, milliseconds timeout,
                                       std::string groupName, MPI_Comm made)
    : Backend(rank, size),
      store_(std::move(store)),
      groupName_(std::move(groupName)),
      globalRanks_(resolveJobRanks(rank, size, globalRanks)),
      defaultGroup_(globalRanks.empty()),
      config_(Config::fromEnv()),
      timeoutMs_(config_.timeoutSeconds > 0 ? static_cast<int64_t>(config_.timeoutSeconds * 1000)
                                            : timeout.count()) {
  comm_.rank = rank;
  comm_.size = size;
  comm_.maxCount = config_.maxElementsPerCall;
  algoComm_ = comm_;
  policy_ = algo::policyFor(config_.algo);
  anySource_ = mpi::chooseAnySourceRecv(config_.anySourceRecv);
  paths_ = std::make_unique<paths::PathFactory>(config_);
  engine_ = Engine::create("mpigpu-" + groupName_);
  watchFailures();
  const int hasGpu = at::hasCUDA() ? 1 : 0;
  const auto peerFailed = givingUpOnFailedMember(made);
  try {
    engine_->runAndWait(
        "new_group", groupName_, rank,
        [this, hasGpu, made] {
          try {
            makeComms(hasGpu, made);
          } catch (...) {
            // No destructor runs for a group that failed to be made: free what it made (a cap on
            // communicators is the likely failure, and the caller may retry after destroying
            // others).
            mpi::ft::removeGroup(this);
            if (node_) node_->free();
            node_.reset();
            mpi::freeComm(&algoComm_.handle);
            mpi::freeComm(&comm_.handle);
            throw;
          }
        },
        std::chrono::hours(24 * 365), peerFailed);
  } catch (...) {
    if (!engine_->leftInsideMpi()) throw;
    gaveUp_ = std::current_exception();  // make() keeps this group and throws it
    return;
  }
  if (config_.debug) {
    // c10 logging: INFO lines show with TORCH_CPP_LOG_LEVEL=INFO, as torch's own backends' do
    if (FLAGS_caffe2_log_level > c10::GLOG_INFO) {
      LOG(WARNING) << logPrefix()
                   << "TORCH_MPIGPU_DEBUG=1 logs at INFO level: set TORCH_CPP_LOG_LEVEL=INFO "
                      "to see the group's setup and every op queued";
    }
    LOG(INFO) << logPrefix() << "created: " << describe();
  }
  if (store_) Watchdog::addGroup({groupName_, rank_, size_, store_, collectives_});
  flightRecorderId_ = fr::Recorder::get().addGroup(groupName_, globalRanks_);
}

// ULFM: when the constructor gives up waiting for its communicators (see givingUpOnFailed).
std::function<std::string()> ProcessGroupMPIGPU::givingUpOnFailedMember(MPI_Comm made) const {
  // (the job's ranks, torch's global ranks; a given communicator: all its ranks)
  std::vector<int> members;
  if (made == MPI_COMM_NULL) members.assign(globalRanks_.begin(), globalRanks_.end());
  return givingUpOnFailed(made != MPI_COMM_NULL ? made : mpi::jobComm().comm, members,
                          c10::str("the job (new group '", groupName_, "')"));
}

c10::intrusive_ptr<ProcessGroupMPIGPU> ProcessGroupMPIGPU::make(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::vector<int64_t> globalRanks,
    milliseconds timeout, std::string groupName, MPI_Comm made) {
  auto pg = c10::make_intrusive<ProcessGroupMPIGPU>(
      std::move(store), rank, size, std::move(globalRanks), timeout, std::move(groupName), made);
  if (pg->gaveUp_) {
    keepUntilExit(pg);
    std::rethrow_exception(pg->gaveUp_);
  }
  return pg;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupMPIGPU::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  const char* op = "split_group";
  for (int r : ranks)
    MPIGPU_CHECK_VALUE(r >= 0 && r < size_, op, rank_, "rank ", r, " is not a rank of group '",
                       groupName_, "' (size ", size_, ")");
  if (lastSplit_.store && lastSplit_.store.get() == store.get() && lastSplit_.ranks == ranks)
    return lastSplit_.child ? lastSplit_.child->lock() : nullptr;
  const auto mine = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = mine != ranks.end();
  // on the engine, after the ops queued before it; shared with the task, which a timeout below
  // leaves queued
  struct Result {
    MPI_Comm child = MPI_COMM_NULL;
    std::vector<int> made;
  };
  auto result = std::make_shared<Result>();
  const bool done = currentEngine(op)->runAndWait(
      op, groupName_, rank_,
      [this, result, ranks, op] {
        result->child = mpi::splitComm(comm_, ranks, &result->made, op);
      },
      timeout(), givingUpOnFailed(comm_.handle, {}, c10::str("group '", groupName_, "'")));
  if (!done)
    MPIGPU_THROW_BACKEND(op, rank_, "the split of group '", groupName_,
                         "' did not complete within ", timeout().count(),
                         " ms: every rank of the group must call split_group (DeviceMesh calls "
                         "it once per mesh dimension); the group is not usable after this");
  if (!member) {
    lastSplit_ = {store, ranks, std::nullopt};
    return nullptr;
  }
  if (result->child == MPI_COMM_NULL) {
    std::ostringstream got, asked;
    for (int r : result->made) got << " " << r;
    for (int r : ranks) asked << " " << r;
    MPIGPU_CHECK_VALUE(false, op, rank_, "this rank asked for a group of ranks [", asked.str(),
                       " ] of group '", groupName_, "', but the ranks that split with it make [",
                       got.str(),
                       " ]: every rank must pass the same split_ranks, each rank in at most one "
                       "of them");
  }
  std::vector<int64_t> global;
  for (int r : ranks) global.push_back(globalRanks_[r]);
  const std::string asked = opts ? compat::groupName(*opts) : "";
  const std::string name = !asked.empty() ? asked : c10::str(groupName_, ":split:", ranks.front());
  c10::intrusive_ptr<c10d::Backend> child = ProcessGroupMPIGPU::make(
      store, static_cast<int>(mine - ranks.begin()), static_cast<int>(ranks.size()),
      std::move(global), opts ? opts->timeout : timeout(), name, result->child);
  lastSplit_ = {store, ranks, c10::weak_intrusive_ptr<c10d::Backend>(child)};
  return child;
}

#if MPIGPU_TORCH_HAS_SHRINK
c10::intrusive_ptr<c10d::Backend> ProcessGroupMPIGPU::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>& optsOverride) {
  const char* op = "shrink_group";
  constexpr int kShrinkAbort = 0x01;  // torch.distributed.SHRINK_ABORT
  std::vector<bool> excluded(size_, false);
  std::ostringstream without;
  for (int64_t r : ranksToExclude) {
    MPIGPU_CHECK_VALUE(r >= 0 && r < size_, op, rank_, "rank ", r, " is not a rank of group '",
                       groupName_, "' (size ", size_, ")");
    excluded[r] = true;
    without << "-" << r;
  }
  MPIGPU_CHECK_VALUE(!excluded[rank_], op, rank_,
                     "this rank is among ranks_to_exclude: only the ranks that stay call "
                     "shrink_group");
  std::vector<int64_t> stay;
  int newRank = -1, size = 0;
  for (int r = 0; r < size_; ++r) {
    if (excluded[r]) continue;
    if (r == rank_) newRank = size;
    stay.push_back(globalRanks_[r]);
    ++size;
  }
  const std::string name = optsOverride && !optsOverride->group_name.empty()
                               ? optsOverride->group_name
                               : c10::str(groupName_, ":shrunk-without", without.str());
  const milliseconds childTimeout = optsOverride ? optsOverride->timeout : timeout();
  // torch renumbers the ranks of a shrunk default group: its communicator becomes the job's, in
  // which torch's global ranks (new groups' members) are looked up from then on
  const bool isDefault = defaultGroup_;
  auto made = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  // ULFM, a group with failed members: MPIX_Comm_shrink instead
  if (mpi::ft::active() &&
      (!mpi::ft::failedRanks(comm_.handle).empty() || mpi::ft::isRevoked(comm_.handle)))
    *made = shrinkSurvivors(ranksToExclude, isDefault);
  auto makeComm = [made, members = std::vector<int>(stay.begin(), stay.end()), name, rank = rank_,
                   isDefault] {
    *made = mpi::createGroupComm(members, name, rank);
    if (isDefault) mpi::useJobComm(*made);
  };
  std::shared_ptr<Engine> engine;
  if (*made != MPI_COMM_NULL) {  // (shrunk by ULFM above)
  } else if (shrinkFlags & kShrinkAbort) {
    abort();  // its outstanding ops fail; the communicator is made on an engine of its own
    engine = Engine::create("mpigpu-shrink-" + groupName_);
  } else {
    engine = currentEngine(op);  // after the ops queued before it
  }
  if (engine && !engine->runAndWait(op, groupName_, rank_, makeComm, timeout()))
    MPIGPU_THROW_BACKEND(op, rank_, "the shrink of group '", groupName_,
                         "' did not complete within ", timeout().count(),
                         " ms: every rank that stays must call shrink_group with the same "
                         "ranks_to_exclude, and an op of this group still waiting (for an "
                         "excluded rank, say) holds it: pass shrink_flags=SHRINK_ABORT to fail "
                         "such ops first");
  if (isDefault) stay.clear();  // (the default group's members: the whole job communicator)
  return ProcessGroupMPIGPU::make(store_, newRank, static_cast<int>(size), std::move(stay),
                                  childTimeout, name, *made);
}

// ULFM (mpi/FaultTolerance.hpp), a group with failed members: revoke it (its ops fail on every
// survivor), then MPIX_Comm_shrink: the live members' communicator, which must be the ranks that
// stay, agreed over it (a rank that failed during the shrink, or survivors that passed different
// ranks_to_exclude, make every survivor raise the same error; calling shrink_group again with
// the ranks now failed retries).
MPI_Comm ProcessGroupMPIGPU::shrinkSurvivors(const std::vector<int64_t>& ranksToExclude,
                                             bool isDefault) {
  const char* op = "shrink_group";
  std::vector<int> stayRanks;  // in this group
  for (int r = 0; r < size_; ++r)
    if (std::find(ranksToExclude.begin(), ranksToExclude.end(), r) == ranksToExclude.end())
      stayRanks.push_back(r);
  // MPIX_Comm_shrink waits for every live member: a live rank among ranks_to_exclude (which does
  // not call shrink_group) would hold it forever
  int live = -1;
  const std::vector<int> dead = awaitFailed(comm_.handle, ranksToExclude, &live);
  MPIGPU_CHECK_VALUE(
      live < 0, op, rank_, "rank ", live, " of group '", groupName_,
      "' is in ranks_to_exclude but has not failed (its failed ranks: ", bracketed(dead),
      "). Where ranks of a group have failed, shrink_group (MPIX_Comm_shrink) "
      "keeps every live rank: exclude exactly the failed ranks, then shrink the "
      "result again to leave out live ones");
  // every op still queued or waiting fails (revoked on every member), and the group is done
  mpi::ft::revoke(comm_.handle);
  mpi::ft::revoke(algoComm_.handle);
  if (node_) node_->abandon();
  abort();
  auto engine = Engine::create("mpigpu-shrink-" + groupName_);
  auto result = std::make_shared<Survivors>();
  // The default group shrinks the job communicator (the same ranks): a creation left inside MPI
  // by a failure (see givingUpOnFailed) holds Open MPI 5's context-id allocation for every
  // communicator but its parent, the job's, whose MPIX_Comm_shrink still goes through (measured).
  const MPI_Comm parent = isDefault ? mpi::jobComm().comm : comm_.handle;
  const bool done = engine->runAndWait(
      op, groupName_, rank_,
      [parent, result, stayRanks, isDefault, op, rank = rank_] {
        shrinkParent(parent, stayRanks, isDefault, op, rank, result.get());
      },
      timeout());
  if (!done)
    MPIGPU_THROW_BACKEND(op, rank_, "the shrink of group '", groupName_,
                         "' (MPIX_Comm_shrink) did not complete within ", timeout().count(),
                         " ms: every live rank of the group must call shrink_group");
  if (!result->agreed)
    MPIGPU_THROW_BACKEND(op, rank_, "the live ranks of group '", groupName_, "' are ",
                         bracketed(result->members), " but ranks_to_exclude leaves ",
                         bracketed(stayRanks),
                         " (on this rank or another: a rank failed during the shrink, or the "
                         "survivors passed different ranks_to_exclude); ranks now known failed: ",
                         bracketed(mpi::ft::failedRanks(comm_.handle)),
                         ". Call shrink_group again, on every survivor, excluding every failed "
                         "rank");
  return result->comm;
}
#endif

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupMPIGPU::getBackendOptions() {
  auto opts = c10::make_intrusive<CopyableOptions>(getBackendName(), timeout());
  compat::describeGroup(*opts, groupName_, globalRanks_);
  return opts;
}

// On the group's engine thread at creation, collective over the group: which ranks share a node,
// and the node algorithm's state where shared memory is on.
void ProcessGroupMPIGPU::makeComms(int hasGpu, MPI_Comm made) {
  comm_.handle =
      made != MPI_COMM_NULL ? made : mpi::createGroupComm(globalRanks_, groupName_, rank_);
  // ULFM: watched from here (pollFailures), so that a member failing while the group is made
  // revokes it; registered again below with the algorithms' communicator
  mpi::ft::addGroup(this, groupName_, comm_.handle, MPI_COMM_NULL, nullptr);
  int commRank = -1;
  MPI_Comm_rank(comm_.handle, &commRank);
  if (commRank != rank_) {
    MPIGPU_THROW_BACKEND("new_group", rank_, "MPI placed this process at rank ", commRank,
                         " of the new communicator, torch at ", rank_);
  }
  bool crowded = false;
  comm_.arrive = algoComm_.arrive = mpi::agreeArrival(comm_.handle, "new_group", rank_, &crowded);
  comm_.crowded = algoComm_.crowded = crowded;
  // One reduction, two agreements: whether any member has a GPU, and whether the settings that
  // choose the group's collectives are the same on every rank (the largest and smallest digest).
  // Where they differ, ranks would choose different collectives and hang or compute wrong
  // results: every rank learns which differ, from every rank's values, and raises the same error.
  const int64_t digest = digestOf(config_.sharedSettings);
  const int64_t mine[3] = {hasGpu, digest, -digest};
  int64_t most[3] = {0, 0, 0};
  MPIGPU_MPI_CHECK(MPI_Allreduce(mine, most, 3, MPI_INT64_T, MPI_MAX, comm_.handle), "new_group",
                   rank_);
  if (most[1] != -most[2]) {
    const std::string differ =
        settingsThatDiffer(mpi::allgatherStrings(config_.sharedSettings, comm_.handle));
    MPIGPU_THROW_BACKEND(
        "new_group", rank_, "settings that every rank of a group must share differ between the ",
        size_, " ranks of group '", groupName_, "': ", differ,
        ". They choose the group's collectives, so its ranks would not match (a hang or wrong "
        "results). Give every rank the same value: set them before the launch, which passes the "
        "environment to every rank (Open MPI's mpirun: -x NAME; srun and MPICH's mpiexec pass it "
        "whole), not per rank inside the program; docs/settings.md lists which settings each "
        "rank may keep its own.");
  }
  MPIGPU_MPI_CHECK(MPI_Comm_dup(comm_.handle, &algoComm_.handle), "new_group", rank_);
  mpi::noteMade(algoComm_.handle);
  groupHasGpu_ = most[0] != 0;
  paths_->confirm(algoComm_, groupHasGpu_, "new_group");
  if (size_ > 1) readNodes(hasGpu);
  // ULFM: a process failure found by any op revokes this group if it holds the failed rank
  mpi::ft::addGroup(this, groupName_, comm_.handle, algoComm_.handle, [this] {
    if (node_) node_->abandon();
  });
}

void ProcessGroupMPIGPU::readNodes(int hasGpu) {
  if (config_.nodeBufferBytes == 0) {
    node::Topology t = node::Topology::build(algoComm_, config_.pretendNodes, "new_group");
    spansNodes_ = t.localSize < size_;
    nodesWithoutNode_ = c10::str(t.describe(), ", shared memory off (NODE_BUFFER_BYTES=0)");
    t.free();
    return;
  }
  // every member with a GPU: the node ops run in device slots; some: through host memory
  int allGpu = hasGpu;
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &allGpu, 1, MPI_INT, MPI_MIN, comm_.handle),
                   "new_group", rank_);
  const bool testSlots = config_.nodeTestDeviceSlots && !groupHasGpu_;
  node_ = std::make_unique<node::Node>(
      node::Topology::build(algoComm_, config_.pretendNodes, "new_group"), algoComm_,
      node::HostSpec{config_.nodeBufferBytes, config_.nodeOneShotBytes, config_.nodeSingleCopyBytes,
                     config_.testNoSingleCopy, config_.nodeLeader},
      allGpu != 0 || testSlots,
      testSlots ? algo::hostDeviceSlotsForTests() : paths_->nodeSlots(c10::DeviceType::CUDA),
      node::SlotsSpec{config_.nodeDeviceBufferBytes, config_.nodeDeviceOrder, timeoutMs_.load(),
                      std::max(config_.nodeDeviceBufferBytes, config_.nodeDeviceBufferMaxBytes)});
  if (allGpu != 0 && !testSlots)
    node_->readDevices(paths_->nodeDeviceId(c10::DeviceType::CUDA), "new_group");
  spansNodes_ = node_->topology().localSize < size_;
}

ProcessGroupMPIGPU::~ProcessGroupMPIGPU() {
  try {
    mpi::ft::removeGroup(this);
    shutdown();
  } catch (...) {
    // Destructors must not throw; at worst the communicators leak until MPI_Finalize.
  }
}

std::shared_ptr<Engine> ProcessGroupMPIGPU::currentEngine(const char* op) const {
  std::lock_guard<std::mutex> lock(engineMutex_);
  MPIGPU_CHECK_VALUE(engine_ != nullptr, op, rank_,
                     "the process group has been destroyed or aborted; create a new one");
  return engine_;
}

void ProcessGroupMPIGPU::shutdown() {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(engineMutex_);
    engine = engine_;
  }
  if (!engine) return;
  if (!engine->stopped() && !mpi::isFinalized()) {
    // Ops still queued run first, in issue order (their peers may be inside them already); then
    // the communicators are freed. Bounded by the group's timeout: an op whose peers never come
    // would otherwise hold destroy_process_group() forever.
    const bool done = engine->runAndWait(
        "destroy_process_group", groupName_, rank_,
        [this, worker = engine.get()] {
          worker->failHeldReceives(comm_.handle,
                                   "was still outstanding when the process group was destroyed "
                                   "(held until a message matched a receive from any source)");
          mpi::ft::removeGroup(this);
          if (node_) node_->free();
          mpi::freeComm(&algoComm_.handle);
          mpi::freeComm(&comm_.handle);
        },
        timeout());
    if (!done) {
      LOG(WARNING) << logPrefix() << "destroy_process_group: the ops ahead of it did not finish "
                   << "within the timeout (" << timeout().count()
                   << " ms); aborting the group instead (its outstanding ops fail)";
      abort();
      return;
    }
  }
  // after the queued ops: the notice's count of collectives is final
  Watchdog::leaveGroup(groupName_, rank_, /*hostsStore=*/globalRanks_[rank_] == 0);
  std::lock_guard<std::mutex> lock(engineMutex_);
  engine_.reset();  // (the engine stops with its last group: it may be shared)
}

void ProcessGroupMPIGPU::abort() {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(engineMutex_);
    engine = std::move(engine_);
  }
  if (!engine) return;
  mpi::ft::removeGroup(this);
  Watchdog::removeGroup(groupName_, rank_);
  if (node_) node_->cancel();  // an op waiting in shared memory fails instead of waiting on
  // Not freed: MPI_Comm_free is collective in spirit, and an op stuck in MPI still uses them.
  // (a shared engine goes on serving the other groups, unless this group's op blocks MPI)
  const bool stopped = engine->abortGroup(groupName_, "was aborted (the process group's abort())");
  // a worker stuck inside MPI after abort() still uses its engine
  if (!stopped) keepUntilExit(std::move(engine));
}

std::string ProcessGroupMPIGPU::logPrefix() const {
  return c10::str("[mpigpu group '", groupName_, "' rank ", rank_, "/", size_, ", world rank ",
                  globalRanks_[rank_], "] ");
}

std::string ProcessGroupMPIGPU::describe() const {
  const auto& env = mpi::ensureInitialized();
  std::ostringstream s;
  s << "group '" << groupName_ << "' rank " << rank_ << "/" << size_ << " (world ranks";
  for (int r : globalRanks_) s << " " << r;
  s << "), " << env.libraryVersion << ", " << mpi::threadLevelName(env.threadLevel) << ", timeout "
    << timeout().count() << " ms, max elements per MPI call " << config_.maxElementsPerCall
    << ", fusion up to " << config_.fusionBytes
    << " bytes per MPI call; paths: " << paths_->describe() << "; nodes: "
    << (node_                        ? node_->describe()
        : !nodesWithoutNode_.empty() ? nodesWithoutNode_
                                     : std::string("one (a single rank)"))
    << (comm_.crowded ? "; crowded: a member's host runs more ranks than cores" : "")
    << "; reductions: " << algo::describeChoice(policy_, config_, groupHasGpu_)
    << "; receives from any source " << anySource_.why;
  return s.str();
}

void ProcessGroupMPIGPU::setTimeout(milliseconds timeout) {
  if (config_.timeoutSeconds > 0) return;  // TORCH_MPIGPU_TIMEOUT overrides every timeout
  timeoutMs_.store(timeout.count(), std::memory_order_relaxed);
}

}  // namespace mpigpu
