#include "node/Topology.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <vector>

#include "mpi/Check.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu::node {

Topology Topology::build(const mpi::Comm& group, int pretendNodes, const char* op) {
  Topology t;
  try {
    t.split(group, pretendNodes, op);
  } catch (...) {
    t.free();  // what was made before the failure (a cap on communicators, most likely)
    throw;
  }
  return t;
}

void Topology::findNode(const mpi::Comm& group, int pretendNodes, const char* op) {
  const int rank = group.rank;
  MPI_Comm shared = MPI_COMM_NULL;
  mpi::arriveTogether(group, op);
  MPIGPU_MPI_CHECK(
      MPI_Comm_split_type(group.handle, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared), op,
      rank);
  mpi::noteMade(shared);
  nodeComm.handle = shared;  // owned from here: free() releases it if a later call fails
  int lr = 0, ls = 1;
  MPI_Comm_rank(shared, &lr);
  MPI_Comm_size(shared, &ls);
  if (pretendNodes > 1) {
    // consecutive local ranks form each pretend node (k of them, sizes differing by at most one)
    const int k = std::min(pretendNodes, ls);
    MPI_Comm part = MPI_COMM_NULL;
    MPIGPU_MPI_CHECK(MPI_Comm_split(shared, static_cast<int>(int64_t{lr} * k / ls), lr, &part), op,
                     rank);
    mpi::noteMade(part);
    mpi::freeComm(&nodeComm.handle);
    shared = nodeComm.handle = part;
    MPI_Comm_rank(shared, &lr);
    MPI_Comm_size(shared, &ls);
  }
  localRank = lr;
  localSize = ls;
  // MPI caps the communicators a process holds (MPICH: 2048 context ids), so none is kept that
  // repeats the group's: a node holding the whole group is the group (split_type kept the group's
  // order), and a rank alone on its node needs no node communicator of its own.
  if (ls == group.size || ls == 1) {
    mpi::freeComm(&nodeComm.handle);
    shared = ls == 1 ? MPI_COMM_SELF : group.handle;
    nodeCommOwned = false;
  }
  nodeComm = {shared, lr, ls, group.maxCount, group.arrive, group.crowded};
}

void Topology::split(const mpi::Comm& group, int pretendNodes, const char* op) {
  findNode(group, pretendNodes, op);
  const int rank = group.rank, lr = localRank, ls = localSize;
  size = group.size;
  int range[2] = {-ls, ls};  // (-fewest, most) in one call
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT, MPI_MAX, group.handle), op, rank);
  fewest = -range[0];
  most = range[1];
  uniform = fewest == most;
  lanes = fewest;
  if (uniform) {
    nodes = group.size / ls;
  } else {  // every node has one local rank 0
    nodes = lr == 0 ? 1 : 0;
    MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &nodes, 1, MPI_INT, MPI_SUM, group.handle), op,
                     rank);
  }
  std::vector<int> crossMembers{rank};  // the cross communicator's group ranks, in its order
  if (nodes > 1) {
    // one rank per node: the cross communicator is the group, in its order
    if (uniform && ls == 1) {
      crossComm = {group.handle, rank, nodes, group.maxCount, group.arrive, group.crowded};
      crossCommOwned = false;
    } else {
      MPI_Comm cross = MPI_COMM_NULL;
      MPIGPU_MPI_CHECK(MPI_Comm_split(group.handle, lr < lanes ? lr : MPI_UNDEFINED, rank, &cross),
                       op, rank);
      if (cross != MPI_COMM_NULL) {
        mpi::noteMade(cross);
        int cr = 0;
        MPI_Comm_rank(cross, &cr);
        crossComm = {cross, cr, nodes, group.maxCount, group.arrive, group.crowded};
      }
    }
    if (uniform) {
      crossMembers.resize(nodes);
      MPIGPU_MPI_CHECK(
          MPI_Allgather(&rank, 1, MPI_INT, crossMembers.data(), 1, MPI_INT, crossComm.handle), op,
          rank);
    }
  }
  if (!uniform && nodes > 1) placeEveryRank(group, op);
  if (uniform) {
    placement.resize(static_cast<size_t>(ls) * nodes);
    MPIGPU_MPI_CHECK(MPI_Allgather(crossMembers.data(), nodes, MPI_INT, placement.data(), nodes,
                                   MPI_INT, nodeComm.handle),
                     op, rank);
  }
}

// Groups whose nodes hold different counts: every rank's place, and the nodes' members and
// order in each lane (collective over the group).
void Topology::placeEveryRank(const mpi::Comm& group, const char* op) {
  const int rank = group.rank;
  leader = rank;  // nodeComm keeps group rank order: its rank 0 is local index 0
  MPIGPU_MPI_CHECK(MPI_Bcast(&leader, 1, MPI_INT, 0, nodeComm.handle), op, rank);
  const int mine[3] = {localRank, crossComm.handle != MPI_COMM_NULL ? crossComm.rank : -1, leader};
  std::vector<int> all(static_cast<size_t>(3) * group.size);
  MPIGPU_MPI_CHECK(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, group.handle), op, rank);
  places.resize(group.size);
  for (int r = 0; r < group.size; ++r) places[r] = {all[3 * r], all[3 * r + 1], all[3 * r + 2]};
  members.assign(nodes, {});
  laneNodes.assign(lanes, std::vector<int>(nodes));
  for (int r = 0; r < group.size; ++r) {
    const Place& at = places[r];
    const int n = places[at.leader].cross;
    // nodeComm keeps group rank order, so a node's ranks come in local order
    TORCH_INTERNAL_ASSERT(static_cast<int>(members[n].size()) == at.local,
                          "mpigpu: the node's ranks are not in local order");
    members[n].push_back(r);
    if (at.local < lanes) laneNodes[at.local][at.cross] = n;
  }
  node = places[leader].cross;
}

std::pair<int, int> Topology::placeOf(int groupRank) const {
  const auto at = std::find(placement.begin(), placement.end(), groupRank) - placement.begin();
  TORCH_INTERNAL_ASSERT(at < static_cast<int64_t>(placement.size()), "mpigpu: rank ", groupRank,
                        " is not in the group's placement");
  return {static_cast<int>(at / nodes), static_cast<int>(at % nodes)};
}

Topology::Carrier Topology::carrierOf(int root) const {
  if (places.empty()) {  // uniform (or one node): the root's own local index carries it
    const auto [rootLocal, rootCross] = placeOf(root);
    return {rootLocal, rootLocal, rootCross, true};
  }
  const Place& r = places.at(root);
  const bool inLane = r.local < lanes;
  return {r.local, inLane ? r.local : 0, inLane ? r.cross : places.at(r.leader).cross,
          r.leader == leader};
}

std::vector<int> Topology::carried(int n, int lane) const {
  std::vector<int> v;
  for (size_t k = lane; k < members.at(n).size(); k += lanes) v.push_back(members[n][k]);
  return v;
}

void Topology::free() {
  if (crossCommOwned) mpi::freeComm(&crossComm.handle);
  if (nodeCommOwned) mpi::freeComm(&nodeComm.handle);
  crossComm.handle = nodeComm.handle = MPI_COMM_NULL;
}

std::string Topology::describe() const {
  if (!uniform) return c10::str(nodes, " nodes of ", fewest, " to ", most, " ranks (not uniform)");
  return c10::str(nodes, nodes == 1 ? " node x " : " nodes x ", localSize,
                  localSize == 1 ? " rank" : " ranks");
}

}  // namespace mpigpu::node
