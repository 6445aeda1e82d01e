// A group's node-aware state: its topology (made with the group) and its shared-memory segment
// (made at the first op that needs it, so groups that never reduce on the host hold none).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "node/DeviceSlots.hpp"
#include "node/SharedSegment.hpp"
#include "node/Topology.hpp"

namespace mpigpu::node {

// What the node asks of its host shared memory.
struct HostSpec {
  int64_t slotBytes;        // per rank and half
  int64_t oneShotBytes;     // all_reduce up to this is one-shot
  int64_t singleCopyBytes;  // all_gather from this (per rank) reads the peers' buffers in place
  bool refuseSingleCopy;    // tests: this rank's probe fails, as where the kernel forbids reads
  NodeLeader leader = NodeLeader::Auto;  // the leader form (Config.hpp)
};

class Node {
 public:
  // `group`: the communicator the ranks agree over when the segment is made. `allGpu`: every
  // member has a GPU (agreed), so the node's ops run in device slots made by `makeDeviceSlots`
  // (null: this build has none) as `deviceSpec` asks.
  Node(Topology topology, const mpi::Comm& group, HostSpec hostSpec, bool allGpu = false,
       DeviceSlotsMaker makeDeviceSlots = nullptr,
       SlotsSpec deviceSpec = {0, Ordering::Host, 0, 0});
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const Topology& topology() const { return topology_; }
  int64_t oneShotBytes() const { return host_.oneShotBytes; }
  // Whether a host all_gather of `bytes` per rank reads the peers' buffers in place
  // (SharedSegment::readPublished). After segment(); the same on every rank.
  bool singleCopy(int64_t bytes) const { return singleCopy_ && bytes >= host_.singleCopyBytes; }
  // Whether the node's ops take the leader form (Config.hpp: NodeLeader) in `dev` (null: host
  // slots). The same on every rank: the slots' ordering is agreed.
  bool leaderForm(const DeviceSlots* dev) const {
    if (host_.leader != NodeLeader::Auto) return host_.leader != NodeLeader::Off;
    return dev != nullptr && dev->leaderSuits();
  }
  // At creation, collective over the group, where every member has a GPU: `mine` names this
  // rank's GPU (paths/Devices.hpp: nodeDeviceId; "" unknown). Reads whether every node holds
  // fewer GPUs than ranks (ranks sharing a GPU), the case the leader form was measured in.
  void readDevices(const std::string& mine, const char* op);
  // Ranks share their node's GPUs and the node's device ops will take the leader form (no setting
  // turns it off or orders the slots on the device): auto's node rule for device tensors
  // (algorithms/Algorithms.cpp: nodePicks). The same on every rank.
  bool leaderOnSharedDevice() const {
    return allGpu_ && sharesDevice_ && host_.leader != NodeLeader::Off &&
           deviceSpec_.ordering != Ordering::Device;
  }
  // Whether the node-aware algorithms suit this group's shape: more than one of its ranks on
  // some node. Where nodes hold different numbers of ranks, data crosses nodes in `lanes` (the
  // fewest any node holds) per node. The same answer on every rank.
  bool suits() const { return topology_.most > 1; }
  // The segment, made by the first call (collective over the group: every rank agrees whether it
  // exists, so all fall back together). Null: unavailable; describe() says why.
  SharedSegment* segment(const char* op);
  // Groups whose every member has a GPU: every rank's node ops run in device memory.
  bool onDevice() const { return allGpu_; }
  // The device slots, made by the first call (collective over the group, after segment()) on
  // `where`, the op's tensors' device, and made again larger (doubling, up to
  // deviceSpec.maxSlotBytes) when an op would fit in one piece of `wantBytes`: every rank of the
  // group asks for the same at the same op. Null: unavailable, describe() says why, and every
  // rank's ops take the ring.
  DeviceSlots* deviceSlots(const char* op, const at::Device& where, int64_t wantBytes);
  // abort(): an op waiting in the segment gives up (within 200 ms) instead of waiting forever.
  // (From any thread; device slots' barriers give up too.)
  void cancel();
  // cancel(), and the node's peers waiting for this rank in shared memory give up too, and the
  // node and cross-node communicators are revoked (a process failure found by this rank's MPI:
  // mpi/FaultTolerance.hpp).
  void abandon();
  const std::atomic<bool>& cancelled() const { return cancelled_; }
  // Frees the communicators (on the engine thread; collective in spirit, as at group destroy).
  void free();
  std::string describe() const;

 private:
  bool agreeMade(bool made, const std::string& why, const char* othersFailed, const char* what,
                 const char* instead, const char* op, std::string* unavailable, bool warn = true);
  void growDeviceSlots(const char* op, int64_t wantBytes);
  void retire(std::unique_ptr<DeviceSlots> slots, const char* op);

  Topology topology_;
  mpi::Comm group_;
  HostSpec host_;
  std::unique_ptr<SharedSegment> segment_;
  bool singleCopy_ = false;  // every rank of the group can read its node's peers
  std::string noSingleCopy_;
  bool tried_ = false;
  const bool allGpu_;
  bool sharesDevice_ = false;  // readDevices()
  DeviceSlotsMaker makeDeviceSlots_;
  SlotsSpec deviceSpec_;  // slotBytes: the current slots' size
  int64_t firstDeviceSlotBytes_;
  std::unique_ptr<DeviceSlots> deviceSlots_;
  std::mutex slotsMutex_;  // cancel() against the engine thread replacing the slots
  bool triedDevice_ = false;
  std::string deviceUnavailable_;
  std::atomic<bool> cancelled_{false};
  std::string unavailable_;
};

}  // namespace mpigpu::node
