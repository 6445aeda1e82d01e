#include "algorithms/Link.hpp"

#include <chrono>
#include <mutex>
#include <thread>

#include "Errors.hpp"
#include "mpi/Check.hpp"
#include "mpi/Types.hpp"

namespace mpigpu::algo {
namespace {

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Memory of requests MPI could not let go of after an error: freeing it could let MPI write into
// memory that someone else owns by then. Rare, small, and only after a failed op.
std::mutex g_graveMutex;
std::vector<at::Tensor> g_grave;

}  // namespace

Link::~Link() {
  for (auto& p : pending_) {
    if (p.request == MPI_REQUEST_NULL) continue;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Cancel(&p.request);
    // A cancelled receive completes at once; give a matched one a moment to finish.
    int done = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (!done && std::chrono::steady_clock::now() < deadline) {
      MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!done) {
      MPI_Request_free(&p.request);
      std::lock_guard<std::mutex> lock(g_graveMutex);
      g_grave.push_back(p.mpiBuffer);
    }
  }
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
  MPIGPU_MPI_CHECK(MPI_Wait(&p.request, MPI_STATUS_IGNORE), op_, comm_.rank);
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
