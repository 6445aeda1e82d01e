#include "node/Topology.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <vector>

#include "mpi/Check.hpp"

namespace mpigpu::node {

Topology Topology::build(const mpi::Comm& group, int pretendNodes, const char* op) {
  Topology t;
  const int rank = group.rank;
  MPI_Comm shared = MPI_COMM_NULL;
  MPIGPU_MPI_CHECK(
      MPI_Comm_split_type(group.handle, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared), op,
      rank);
  int lr = 0, ls = 1;
  MPI_Comm_rank(shared, &lr);
  MPI_Comm_size(shared, &ls);
  if (pretendNodes > 1) {
    // consecutive local ranks form each pretend node (k of them, sizes differing by at most one)
    const int k = std::min(pretendNodes, ls);
    MPI_Comm part = MPI_COMM_NULL;
    MPIGPU_MPI_CHECK(MPI_Comm_split(shared, static_cast<int>(int64_t{lr} * k / ls), lr, &part), op,
                     rank);
    MPI_Comm_free(&shared);
    shared = part;
    MPI_Comm_rank(shared, &lr);
    MPI_Comm_size(shared, &ls);
  }
  t.localRank = lr;
  t.localSize = ls;
  t.nodeComm = {shared, lr, ls, group.maxCount};
  int range[2] = {-ls, ls};  // (-fewest, most) in one call
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT, MPI_MAX, group.handle), op, rank);
  t.fewest = -range[0];
  t.most = range[1];
  t.uniform = t.fewest == t.most;
  t.nodes = t.uniform ? group.size / ls : 0;
  std::vector<int> crossMembers{rank};  // the cross communicator's group ranks, in its order
  if (t.uniform && t.nodes > 1) {
    MPI_Comm cross = MPI_COMM_NULL;
    MPIGPU_MPI_CHECK(MPI_Comm_split(group.handle, lr, rank, &cross), op, rank);
    int cr = 0;
    MPI_Comm_rank(cross, &cr);
    t.crossComm = {cross, cr, t.nodes, group.maxCount};
    crossMembers.resize(t.nodes);
    MPIGPU_MPI_CHECK(MPI_Allgather(&rank, 1, MPI_INT, crossMembers.data(), 1, MPI_INT, cross), op,
                     rank);
  }
  if (t.uniform) {
    t.placement.resize(static_cast<size_t>(ls) * t.nodes);
    MPIGPU_MPI_CHECK(MPI_Allgather(crossMembers.data(), t.nodes, MPI_INT, t.placement.data(),
                                   t.nodes, MPI_INT, shared),
                     op, rank);
  }
  return t;
}

std::pair<int, int> Topology::placeOf(int groupRank) const {
  const auto at = std::find(placement.begin(), placement.end(), groupRank) - placement.begin();
  TORCH_INTERNAL_ASSERT(at < static_cast<int64_t>(placement.size()), "mpigpu: rank ", groupRank,
                        " is not in the group's placement");
  return {static_cast<int>(at / nodes), static_cast<int>(at % nodes)};
}

void Topology::free() {
  mpi::freeComm(&crossComm.handle);
  mpi::freeComm(&nodeComm.handle);
}

std::string Topology::describe() const {
  if (!uniform) return c10::str("nodes of ", fewest, " to ", most, " ranks (not uniform)");
  return c10::str(nodes, nodes == 1 ? " node x " : " nodes x ", localSize,
                  localSize == 1 ? " rank" : " ranks");
}

}  // namespace mpigpu::node
