// Which ranks of a group share a node, found once when the group is made: a node communicator
// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): ranks that can map the same memory) and, across
// nodes, a cross-node communicator per local index that every node has (the ranks that hold the
// same place on every node): each local index where every node holds the same number of the
// group's ranks, else the first `lanes` (the fewest any node holds). Node-aware algorithms
// (algorithms/NodeAlgorithms.cpp) read from here; subgroups get their own.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mpi/Collectives.hpp"

namespace mpigpu::node {

struct Topology {
  int size = 1;              // the group's ranks
  int nodes = 1;             // how many nodes the group spans
  int localRank = 0;         // this rank's index among the group's ranks on its node
  int localSize = 1;         // the group's ranks on this node
  bool uniform = true;       // every node holds localSize of the group's ranks
  int fewest = 1, most = 1;  // ranks per node, over all nodes
  // Local indices 0..lanes-1 have a cross-node communicator (lanes = fewest: every node has
  // them); a rank at a higher index has none, and its data crosses nodes through a lower one's.
  int lanes = 1;
  mpi::Comm nodeComm;   // the group's ranks on this node, in group rank order
  mpi::Comm crossComm;  // nodes > 1 and localRank < lanes: same local index, one rank per node
  // false where the handle is the group's own communicator (or MPI_COMM_SELF), not freed here
  bool nodeCommOwned = true, crossCommOwned = true;
  // Uniform groups (else empty): every group rank by its place. placement[j * nodes + i] is the
  // group rank of crossComm rank i as local index j sees it (one node: local j's group rank); this
  // rank's cross-node peers are row localRank. Cross ranks follow group rank order per local index,
  // so they need not name the same node for every j.
  std::vector<int> placement;
  // Groups that span nodes holding different counts (else empty): every group rank's local
  // index, its rank in that index's crossComm (-1: above the lanes, none) and its node's leader
  // (the group rank of the node's local index 0, which names the node).
  struct Place {
    int local = 0, cross = -1, leader = 0;
  };
  std::vector<Place> places;
  int leader = 0;  // this rank's node's leader, where `places` is kept
  // Where `places` is kept, nodes are numbered by their leader's rank in lane 0 (every node has
  // a local index 0): members[n] are node n's group ranks in local order, laneNodes[j][i] the
  // node of crossComm rank i in lane j, and `node` this rank's.
  std::vector<std::vector<int>> members;
  std::vector<std::vector<int>> laneNodes;
  int node = 0;
  // The group ranks of node `n` whose data crosses nodes in lane `lane` (local indices lane,
  // lane + lanes, ...: every rank above the lanes has one lane), in local order.
  std::vector<int> carried(int n, int lane) const;
  // How `root`'s data reaches every node: `lane` carries it across (crossRoot: the root's node in
  // that lane's crossComm); where the root is above the lanes (lane != rootLocal), it first goes
  // to every rank of the root's node, lane 0's included.
  struct Carrier {
    int rootLocal = 0, lane = 0, crossRoot = 0;
    bool onRootNode = true;  // this rank is on the root's node
  };
  Carrier carrierOf(int root) const;

  // Collective over `group`, on the group's engine thread. `pretendNodes` > 1 (a test-only
  // setting) cuts each real node into that many nodes of consecutive ranks, so the
  // hierarchical algorithms run on one machine.
  static Topology build(const mpi::Comm& group, int pretendNodes, const char* op);
  void free();  // the communicators made here (idempotent)
  // "1 node x 4 ranks", "2 nodes x 2 ranks", "3 nodes of 1 to 3 ranks (not uniform)".
  std::string describe() const;
  // Where `groupRank` sits: its local index and its rank in that index's crossComm.
  std::pair<int, int> placeOf(int groupRank) const;

 private:
  void split(const mpi::Comm& group, int pretendNodes, const char* op);
  void findNode(const mpi::Comm& group, int pretendNodes, const char* op);  // nodeComm, local*
  void placeEveryRank(const mpi::Comm& group, const char* op);  // places, members, laneNodes
};

}  // namespace mpigpu::node
