#include "node/Node.hpp"

#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>

#include "mpi/Check.hpp"

namespace mpigpu::node {

Node::Node(Topology topology, const mpi::Comm& group, int64_t slotBytes, int64_t oneShotBytes,
           bool allGpu, DeviceSlotsMaker makeDeviceSlots, SlotsSpec deviceSpec)
    : topology_(std::move(topology)),
      group_(group),
      slotBytes_(slotBytes),
      oneShotBytes_(oneShotBytes),
      allGpu_(allGpu),
      makeDeviceSlots_(std::move(makeDeviceSlots)),
      deviceSpec_(deviceSpec) {}

Node::~Node() = default;

// Whether every rank of the group made its part (one MPI_MIN). Where not: the reason (this
// rank's, or `othersFailed`) in *unavailable and one warning naming what takes over.
bool Node::agreeMade(bool made, const std::string& why, const char* othersFailed, const char* what,
                     const char* instead, const char* op, std::string* unavailable) {
  int ok = made ? 1 : 0;
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, group_.handle), op,
                   group_.rank);
  if (ok) return true;
  *unavailable = why.empty() ? othersFailed : why;
  LOG(WARNING) << "mpigpu " << op << " [rank " << group_.rank << "]: no " << what << " ("
               << *unavailable << "); " << instead;
  return false;
}

SharedSegment* Node::segment(const char* op) {
  if (tried_) return segment_.get();
  tried_ = true;
  std::string why;
  segment_ = SharedSegment::create(topology_.nodeComm, slotBytes_, op, group_.rank, &why);
  if (!agreeMade(segment_ != nullptr, why, "another rank could not map its node's segment",
                 "shared-memory segment for the node-aware algorithms",
                 "this group's reductions use the ring instead, all_gather and broadcast MPI's own",
                 op, &unavailable_)) {
    segment_.reset();
  }
  return segment_.get();
}

DeviceSlots* Node::deviceSlots(const char* op, const at::Device& where) {
  if (triedDevice_) return deviceSlots_.get();
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
    deviceSlots_.reset();
  }
  return deviceSlots_.get();
}

void Node::free() {
  deviceSlots_.reset();
  segment_.reset();
  topology_.free();
}

std::string Node::describe() const {
  std::string s = topology_.describe();
  if (!suits()) return s;
  if (!unavailable_.empty()) return c10::str(s, ", shared memory unavailable: ", unavailable_);
  s = c10::str(s, ", shared memory ", slotBytes_, " bytes per rank and half",
               tried_ ? "" : " (made at the first node-aware op)");
  if (!allGpu_) return s;
  if (!deviceUnavailable_.empty())
    return c10::str(s, ", device slots unavailable: ", deviceUnavailable_);
  return c10::str(s, ", device slots ", deviceSpec_.slotBytes, " bytes per rank and half",
                  deviceSlots_ ? ", " + deviceSlots_->ordering() : " (made at the first node op)");
}

}  // namespace mpigpu::node
