// What every algorithm runs with (Context) and what the choice of one depends on (Facts): the
// bottom of algorithms/, below the building blocks (Steps.hpp), the node algorithms
// (NodeAlgorithms.hpp) and the table that chooses among them (Algorithms.hpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "algorithms/Link.hpp"
#include "algorithms/Reducer.hpp"
#include "mpi/Types.hpp"

namespace mpigpu::node {
class Node;
}  // namespace mpigpu::node

namespace mpigpu::algo {

enum class OpKind { Allreduce, ReduceScatter, Reduce, Allgather, Broadcast };
// The reductions: an algorithm that does not serve one hands it to the ring. The others move
// data and go to MPI's own collectives where no row serves them.
inline bool isReduction(OpKind k) { return k != OpKind::Allgather && k != OpKind::Broadcast; }

struct Context {
  Link& link;
  Reducer& reducer;
  const mpi::Reduction& red;
  int64_t pieceElems;  // largest message, in elements
  node::Node* node;    // the group's node-aware state; null where the group has none
};

// What an op's choice depends on. All of it is the same on every rank of a group (sizes, dtype,
// rank count, settings, the group's shape and whether any member has a GPU, agreed when the
// group was made), so every rank picks the same algorithm even when their tensors live on
// different devices.
struct Facts {
  OpKind kind;
  int64_t bytes;
  at::ScalarType dtype;
  int worldSize;
  bool groupHasGpu;
  bool nodeSuits;   // the group has node-aware state that suits it for this op (node::Node)
  bool spansNodes;  // the group's ranks are on more than one node (whatever the node state)
  // the op's tensors are on a device the node's ranks share, where its node ops take the leader
  // form (node::Node::leaderOnSharedDevice)
  bool onSharedDevice = false;
  // some member's host runs more ranks than cores (the group's agreed mpi::Comm::crowded)
  bool crowded = false;
};

}  // namespace mpigpu::algo
