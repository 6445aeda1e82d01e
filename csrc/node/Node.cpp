#include "node/Node.hpp"

#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <set>
#include <utility>

#include "mpi/Check.hpp"
#include "mpi/Env.hpp"
#include "mpi/FaultTolerance.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu::node {

Node::Node(Topology topology, const mpi::Comm& group, HostSpec hostSpec, bool allGpu,
           DeviceSlotsMaker makeDeviceSlots, SlotsSpec deviceSpec)
    : topology_(std::move(topology)),
      group_(group),
      host_(hostSpec),
      allGpu_(allGpu),
      makeDeviceSlots_(std::move(makeDeviceSlots)),
      deviceSpec_(deviceSpec),
      firstDeviceSlotBytes_(deviceSpec.slotBytes) {}

Node::~Node() = default;

// Whether every rank of the group made its part (one MPI_MIN). Where not: the reason (this
// rank's, or `othersFailed`) in *unavailable and one line naming what takes over: a warning, or
// (`warn` false: an optimisation whose absence changes no result) at INFO level.
bool Node::agreeMade(bool made, const std::string& why, const char* othersFailed, const char* what,
                     const char* instead, const char* op, std::string* unavailable, bool warn) {
  int ok = made ? 1 : 0;
  mpi::arriveTogether(group_, op);
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, group_.handle), op,
                   group_.rank);
  if (ok) return true;
  *unavailable = why.empty() ? othersFailed : why;
  const std::string line = c10::str("mpigpu ", op, " [rank ", group_.rank, "]: no ", what, " (",
                                    *unavailable, "); ", instead);
  if (warn) {
    LOG(WARNING) << line;
  } else {
    LOG(INFO) << line;
  }
  return false;
}

void Node::readDevices(const std::string& mine, const char* op) {
  mpi::arriveTogether(group_, op);
  const std::vector<std::string> ids = mpi::allgatherStrings(mine, topology_.nodeComm.handle);
  const std::set<std::string> distinct(ids.begin(), ids.end());
  int shares = distinct.count("") == 0 && distinct.size() < ids.size() ? 1 : 0;
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &shares, 1, MPI_INT, MPI_MIN, group_.handle), op,
                   group_.rank);
  sharesDevice_ = shares != 0;
}

SharedSegment* Node::segment(const char* op) {
  if (tried_) return segment_.get();
  tried_ = true;
  std::string why;
  {
    auto made = SharedSegment::create(topology_.nodeComm, host_.slotBytes, op, group_.rank, &why);
    std::lock_guard<std::mutex> lock(slotsMutex_);  // abandon() reads it from other threads
    segment_ = std::move(made);
  }
  if (!agreeMade(segment_ != nullptr, why, "another rank could not map its node's segment",
                 "shared-memory segment for the node-aware algorithms",
                 "this group's reductions use the ring instead, all_gather and broadcast MPI's own",
                 op, &unavailable_)) {
    std::lock_guard<std::mutex> lock(slotsMutex_);
    segment_.reset();
    return nullptr;
  }
  // Single copy is tried once, before any op publishes; where any rank cannot read its peers
  // the whole group copies through the slots (one way for every rank: the barriers must match).
  why = host_.refuseSingleCopy
            ? "refused on this rank for a test (TORCH_MPIGPU_TEST_NO_SINGLE_COPY)"
            : segment_->probeSingleCopy();
  singleCopy_ = agreeMade(why.empty(), why, "another rank cannot read its node's peers' memory",
                          "single copy between the node's ranks",
                          "all_gather copies through the shared slots", op, &noSingleCopy_,
                          /*warn=*/false);  // Ubuntu's default ptrace_scope forbids it: not news
  return segment_.get();
}

DeviceSlots* Node::deviceSlots(const char* op, const at::Device& where, int64_t wantBytes) {
  if (triedDevice_) {
    if (deviceSlots_ && wantBytes > deviceSpec_.slotBytes &&
        deviceSpec_.slotBytes < deviceSpec_.maxSlotBytes)
      growDeviceSlots(op, wantBytes);
    return deviceSlots_.get();
  }
  triedDevice_ = true;
  std::string why = "this build has no device slots for the node algorithm (CUDA IPC)";
  if (makeDeviceSlots_) {
    why.clear();
    deviceSlots_ = makeDeviceSlots_(topology_.nodeComm, deviceSpec_, where, op, group_.rank, &why);
  }
  if (!agreeMade(
          deviceSlots_ != nullptr, why, "another rank could not map its node's device buffers",
          "device slots for the node algorithm",
          "this group's node ops use the ring and MPI's own instead", op, &deviceUnavailable_)) {
    retire(std::move(deviceSlots_), op);
  }
  return deviceSlots_.get();
}

// Slots that go while the group lives on (grown, or made on only some ranks) or at its end.
// Collective over the node: every rank calls it at the same point, with or without slots.
void Node::retire(std::unique_ptr<DeviceSlots> slots, const char* op) {
  if (slots) slots->release();
  mpi::barrierOn(topology_.nodeComm, op, group_.rank);
  slots.reset();
}

// New slots of the next power-of-two multiple that holds `wantBytes` (at most the maximum); the
// old ones stay where any rank could not make them, and growing stops.
void Node::growDeviceSlots(const char* op, int64_t wantBytes) {
  SlotsSpec spec = deviceSpec_;
  while (spec.slotBytes < wantBytes && spec.slotBytes < spec.maxSlotBytes) spec.slotBytes *= 2;
  spec.slotBytes = std::min(spec.slotBytes, spec.maxSlotBytes);
  std::string why;
  auto grown =
      makeDeviceSlots_(topology_.nodeComm, spec, deviceSlots_->device(), op, group_.rank, &why);
  std::string failed;
  const std::string instead = c10::str("they stay at ", deviceSpec_.slotBytes,
                                       " bytes per rank and half (ops go in pieces of that size)");
  if (!agreeMade(grown != nullptr, why, "another rank could not grow its node's device buffers",
                 c10::str("larger device slots (", spec.slotBytes, " bytes)").c_str(),
                 instead.c_str(), op, &failed)) {
    deviceSpec_.maxSlotBytes = deviceSpec_.slotBytes;
    retire(std::move(grown), op);
    return;
  }
  std::unique_ptr<DeviceSlots> old;
  {
    std::lock_guard<std::mutex> lock(slotsMutex_);
    old = std::exchange(deviceSlots_, std::move(grown));
    deviceSpec_.slotBytes = spec.slotBytes;
    if (cancelled_.load(std::memory_order_relaxed)) deviceSlots_->cancel();
  }
  retire(std::move(old), op);
}

void Node::cancel() {
  std::lock_guard<std::mutex> lock(slotsMutex_);
  cancelled_.store(true, std::memory_order_relaxed);
  if (deviceSlots_) deviceSlots_->cancel();
}

void Node::abandon() {
  cancel();
  std::lock_guard<std::mutex> lock(slotsMutex_);
  if (segment_) segment_->giveUp();
  // The node and cross-node communicators hold only some of the group's ranks, perhaps not the
  // failed one: a peer blocked in them on this rank (which now leaves the op) would wait forever
  // unless they are revoked too (two hosts: the other node's leader in the cross-node all_reduce)
  mpi::ft::revoke(topology_.nodeComm.handle);
  mpi::ft::revoke(topology_.crossComm.handle);
}

void Node::free() {
  if (deviceSlots_) retire(std::move(deviceSlots_), "destroy_process_group");
  std::lock_guard<std::mutex> lock(slotsMutex_);
  segment_.reset();
  topology_.free();
}

std::string Node::describe() const {
  std::string s = topology_.describe();
  if (!suits()) return s;
  if (!topology_.uniform)
    s = c10::str(s, ", across nodes in ", topology_.lanes,
                 topology_.lanes == 1 ? " lane" : " lanes");
  if (!unavailable_.empty()) return c10::str(s, ", shared memory unavailable: ", unavailable_);
  s = c10::str(s, ", shared memory ", host_.slotBytes, " bytes per rank and half",
               tried_ ? "" : " (made at the first node-aware op)");
  if (singleCopy_)
    s = c10::str(s, ", single copy (process_vm_readv) for all_gather from ", host_.singleCopyBytes,
                 " bytes");
  else if (!noSingleCopy_.empty())
    s = c10::str(s, ", single copy unavailable: ", noSingleCopy_);
  if (!allGpu_)
    return leaderForm(nullptr) ? s + ", the leader form (the node's first rank reduces for all)"
                               : s;
  if (!deviceUnavailable_.empty())
    return c10::str(s, ", device slots unavailable: ", deviceUnavailable_);
  const std::string grown =
      deviceSpec_.slotBytes > firstDeviceSlotBytes_
          ? c10::str(" (grown from ", firstDeviceSlotBytes_, ", at most ", deviceSpec_.maxSlotBytes,
                     ")")
          : c10::str(" (grown on demand up to ", deviceSpec_.maxSlotBytes, ")");
  if (!deviceSlots_)
    return c10::str(s, ", device slots ", deviceSpec_.slotBytes,
                    " bytes per rank and half (made at the first node op)");
  return c10::str(s, ", device slots ", deviceSpec_.slotBytes, " bytes per rank and half", grown,
                  ", ", deviceSlots_->ordering(),
                  leaderForm(deviceSlots_.get())
                      ? ", the leader form (the node's first rank reduces for all)"
                      : "");
}

}  // namespace mpigpu::node
