// How our algorithms move pieces of an op's buffers between ranks: non-blocking point-to-point on
// a communicator of the group's own (MPI_Comm_dup), so users' sends and receives never match them.
//
//   Link          MPI on the buffers' own memory: host memory, or device memory with a
//                 CUDA-aware MPI (then `settle` waits for the device work queued on the comm
//                 stream before MPI reads or writes device memory: MPI does not see streams)
//   cuda/         a staged link: each piece goes device -> pinned host -> MPI -> device
//
// Requests still outstanding when a Link is destroyed (an error part-way) are cancelled and
// freed, and the memory they point to is kept alive until MPI lets go of it.
#pragma once

#include <mpi.h>

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "mpi/Collectives.hpp"

namespace mpigpu::algo {

class Link {
 public:
  // `settle`: makes device work queued so far finish (nullptr on the host). `devicePointers`:
  // MPI takes the op's device memory as it is (a CUDA-aware MPI).
  Link(const mpi::Comm& comm, const char* op, std::function<void()> settle = nullptr,
       bool devicePointers = false)
      : comm_(comm), op_(op), settle_(std::move(settle)), devicePointers_(devicePointers) {}
  virtual ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  const mpi::Comm& comm() const { return comm_; }
  const char* op() const { return op_; }
  // Whether MPI may be handed the op's device memory itself (after settle()).
  bool takesDevicePointers() const { return devicePointers_; }

  // Queues a send of `piece` (contiguous, at most comm().maxCount elements). Work queued before
  // on the device that produces it is finished first. Returns a handle for wait().
  size_t isend(const at::Tensor& piece, int peer);
  // Queues a receive into `piece`. The caller must not touch `piece` until wait().
  size_t irecv(const at::Tensor& piece, int peer);
  // Completes one request; after a receive, `piece` holds the data (in stream order on devices).
  void wait(size_t handle);
  void waitAll(std::vector<size_t>& handles);
  // Every rank's `in`, rank-major, into `out` (size * in.numel() elements).
  virtual void allgather(const at::Tensor& in, const at::Tensor& out);
  // Finishes the device work queued so far (before MPI writes memory a kernel may still use).
  void settle() {
    if (settle_) settle_();
  }

 protected:
  // The memory MPI reads for a send of `piece` (the piece itself here; a pinned copy when staged).
  virtual at::Tensor sendBuffer(const at::Tensor& piece);
  // The memory MPI writes for a receive into `piece`, and what to do once it has arrived.
  virtual at::Tensor recvBuffer(const at::Tensor& piece);
  virtual void received(const at::Tensor& mpiBuffer, const at::Tensor& piece) {}

  const mpi::Comm& comm_;
  const char* op_;
  std::function<void()> settle_;
  const bool devicePointers_;

 private:
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    at::Tensor mpiBuffer;  // kept alive until MPI is done with it
    at::Tensor piece;      // receives: where the data goes
    bool receive = false;
  };
  std::vector<Pending> pending_;
};

}  // namespace mpigpu::algo
