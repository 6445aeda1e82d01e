// MPI calls on tensors. Every tensor here is contiguous and addressable by MPI (host memory, or
// device memory when the MPI is CUDA-aware); the data paths in paths/ make it so. Messages larger
// than Comm::maxCount elements are split, so counts above 2^31-1 work.
#pragma once

#include <mpi.h>

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "mpi/Comm.hpp"
#include "mpi/Types.hpp"

namespace mpigpu::mpi {

// Members-only creation (MPI_Group_incl + MPI_Comm_create_group on the job communicator,
// mpi/Env.hpp): the c10d creator runs on member ranks only, so nothing here may involve
// non-members. `jobRanks` are torch's global ranks; `name` (the group's) tells concurrent
// creations apart where ULFM is on (MPI_Comm_create_from_group, see there).
MPI_Comm createGroupComm(const std::vector<int>& jobRanks, const std::string& name,
                         int rankForErrors);
// A communicator of the ranks `ranks` of `parent`, in that order, split from it: collective over
// `parent`, each rank passing its own child's ranks, or another child's where it is in none (it
// gets MPI_COMM_NULL). Children are told apart by their smallest rank, so they must not overlap.
// Where a child's members passed different lists, each of them gets MPI_COMM_NULL, with the
// ranks MPI grouped it with in *made (a member's *made is those ranks either way).
MPI_Comm splitComm(const Comm& parent, const std::vector<int>& ranks, std::vector<int>* made,
                   const char* op);

// Number of MPI communication calls made by this process (tests count them to prove fusion).
uint64_t callCount();

// `counted`: adds to callCount() (false inside our algorithms, which count their runs themselves).
void allreduceInPlace(const Comm& c, const char* op, at::Tensor& buf, const Reduction& red,
                      bool counted = true);
void broadcast(const Comm& c, const char* op, at::Tensor& buf, int root);
// `out` is used on the root only and may be `in` itself.
void reduce(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
            const Reduction& red, int root);
// `out` holds size * in.numel() elements. `counted`: adds to callCount() (our algorithms count
// their runs themselves).
void allgather(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
               bool counted = true);
// Blocks of different sizes: rank p contributes counts[p] elements (every rank passes the same
// counts; `in` holds counts[c.rank]), packed in rank order into `out`.
void allgatherv(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
                const std::vector<int64_t>& counts, bool counted = true);
void gather(const Comm& c, const char* op, const at::Tensor& in, at::Tensor* out, int root);
void scatter(const Comm& c, const char* op, const at::Tensor* in, at::Tensor& out, int root);
// Blocks of different sizes: rank p gets the reduction of every rank's counts[p] elements at
// offset counts[0] + ... + counts[p-1] of `in` (every rank passes the same counts; `out` holds
// counts[c.rank]).
void reduceScatterV(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
                    const std::vector<int64_t>& counts, const Reduction& red, bool counted = true);
// `in` holds size * out.numel() elements.
void reduceScatter(const Comm& c, const char* op, const at::Tensor& in, at::Tensor& out,
                   const Reduction& red, bool counted = true);
// Counts in elements, one per peer; data packed in peer order; a rank sends itself as many as it
// receives from itself. `uniform`: every count is the same, on every rank (all_to_all_single
// without splits), so whether to split needs no agreement round. `hostEverywhere`: no rank of the
// group holds device memory (agreed when it was made), so MPI_Alltoall may serve uniform counts.
void alltoallv(const Comm& c, const char* op, const at::Tensor& in,
               const std::vector<int64_t>& sendCounts, at::Tensor& out,
               const std::vector<int64_t>& recvCounts, bool uniform = false,
               bool hostEverywhere = false);
void barrier(const Comm& c, const char* op);

// Non-blocking point-to-point; one request per chunk, all with the same tag (MPI keeps order).
std::vector<MPI_Request> isend(const Comm& c, const char* op, const at::Tensor& buf, int dst,
                               int tag);
std::vector<MPI_Request> irecv(const Comm& c, const char* op, at::Tensor& buf, int src, int tag);
// The message MPI_Improbe matched, received into `buf` (checked by checkAnySourceCount when the
// receive was issued: a check here would come after the message was taken).
std::vector<MPI_Request> imrecv(const Comm& c, const char* op, at::Tensor& buf, MPI_Message* msg);
// Receives from any source are one message each (MPI_Improbe matches one): an error naming `op`
// when `buf` needs more than one MPI call.
void checkAnySourceCount(const Comm& c, const char* op, const at::Tensor& buf);
// Tests each request still active with MPI_Test, filling `statuses` (one per request, kept by the
// caller across calls) as each completes; `done` once all have. Returns the first error. Not
// MPI_Testall: MPICH raises errors of multiple-completion calls (a receive smaller than its
// message) through MPI_COMM_WORLD's handler, fatal by default, where MPI_Test uses the request's
// communicator's, which returns them.
int testEach(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses, bool& done);
// Cancels the requests still active and waits a moment (200 ms) for them to complete; frees what
// is left. False when some were freed unfinished: MPI may still use their buffers, which the
// caller must then keep alive for the rest of the process (keepUntilExit).
bool cancelRequests(std::vector<MPI_Request>& requests);

}  // namespace mpigpu::mpi
