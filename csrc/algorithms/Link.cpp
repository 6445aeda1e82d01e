#include "algorithms/Link.hpp"

#include "core/Errors.hpp"
#include "core/KeepUntilExit.hpp"
#include "mpi/Check.hpp"
#include "mpi/Wait.hpp"
#include "mpi/Collectives.hpp"
#include "mpi/Types.hpp"

namespace mpigpu::algo {
namespace {

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace

Link::~Link() {
  // Requests still out when an op failed midway: cancelled; the buffers of any MPI could not let
  // go of stay alive.
  std::vector<MPI_Request> active;
  std::vector<at::Tensor> buffers;
  for (auto& p : pending_) {
    if (p.request == MPI_REQUEST_NULL) continue;
    active.push_back(p.request);
    buffers.push_back(p.mpiBuffer);
  }
  if (active.empty() || mpi::cancelRequests(active)) return;
  for (auto& b : buffers) keepUntilExit(std::move(b));
}

at::Tensor Link::sendBuffer(const at::Tensor& piece) {
  settle();
  return piece;
}

at::Tensor Link::recvBuffer(const at::Tensor& piece) {
  // MPI writes device memory outside any stream: nothing queued may still use it. That includes
  // memory the caching allocator just handed back (a GPU run saw MPI overwrite PREMUL_SUM's
  // factor, freed a moment before and reused as this receive buffer, while the kernel reading it
  // was still queued).
  settle();
  return piece;
}

size_t Link::isend(const at::Tensor& piece, int peer) {
  Pending p;
  p.mpiBuffer = sendBuffer(piece);
  const MPI_Datatype type = mpi::transportType(piece.scalar_type(), op_, comm_.rank);
  MPIGPU_MPI_CHECK(MPI_Isend(bytes(p.mpiBuffer), static_cast<int>(piece.numel()), type, peer, 0,
                             comm_.handle, &p.request),
                   op_, comm_.rank);
  pending_.push_back(std::move(p));
  return pending_.size() - 1;
}

size_t Link::irecv(const at::Tensor& piece, int peer) {
  Pending p;
  p.mpiBuffer = recvBuffer(piece);
  p.piece = piece;
  p.receive = true;
  const MPI_Datatype type = mpi::transportType(piece.scalar_type(), op_, comm_.rank);
  MPIGPU_MPI_CHECK(MPI_Irecv(bytes(p.mpiBuffer), static_cast<int>(piece.numel()), type, peer, 0,
                             comm_.handle, &p.request),
                   op_, comm_.rank);
  pending_.push_back(std::move(p));
  return pending_.size() - 1;
}

void Link::wait(size_t handle) {
  Pending& p = pending_.at(handle);
  if (p.request == MPI_REQUEST_NULL && !p.mpiBuffer.defined()) return;  // waited already
  mpi::wait(&p.request, op_, comm_.rank);
  if (p.receive) received(p.mpiBuffer, p.piece);
  p.mpiBuffer = at::Tensor();
  p.piece = at::Tensor();
}

void Link::waitAll(std::vector<size_t>& handles) {
  for (size_t h : handles) wait(h);
  handles.clear();
}

void Link::allgather(const at::Tensor& in, const at::Tensor& out) {
  settle();
  at::Tensor o = out;
  mpi::allgather(comm_, op_, in, o, /*counted=*/false);
}

}  // namespace mpigpu::algo
