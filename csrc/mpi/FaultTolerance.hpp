// Surviving a dead rank with a fault-tolerant MPI (ULFM: Open MPI 5 under `mpirun --with-ft
// ulfm`; MPICH's MPIX_Comm_* interface where its FT mode is on). Where ULFM is active, a failed
// call whose error class is a process failure (MPIX_ERR_PROC_FAILED, _PENDING, MPIX_ERR_REVOKED)
// revokes every registered group that holds a failed process, so that survivors blocked in other
// ops of those groups wake with an error too, and becomes a DistBackendError naming the failed
// ranks per group. Groups without a failed process are left alone. The group's shrink then makes
// the survivors' communicator with MPIX_Comm_shrink. Without ULFM (compiled or active), nothing
// here changes anything: a dead rank ends the job, as the launcher decides.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace mpigpu::mpi::ft {

// This MPI has the ULFM interface (mpi-ext.h's ftmpi extension, or MPICH's MPIX_Comm_shrink).
bool compiled();
// ULFM is on in this run (decided once; MPI must be initialised): Open MPI's mpi_ft_enable
// (what `mpirun --with-ft ulfm` sets), MPICH's MPIR_CVAR_ENABLE_FT, read through MPI_T with the
// environment as fallback.
bool active();
// One line for torch_mpi_gpu.info: on or off, and why.
std::string describe();
// A process-failure error class, where ULFM is active.
bool isProcessFailure(int code);

// The ranks of `comm` this process knows to have failed (ascending; empty without ULFM).
std::vector<int> failedRanks(MPI_Comm comm);
// Revokes `comm` (no-op for MPI_COMM_NULL or without ULFM); errors are ignored (it may be
// revoked already).
void revoke(MPI_Comm comm);
bool isRevoked(MPI_Comm comm);
// Acknowledges the failures known in `comm`, so that receives from any source on it work again
// (the MPI store's server).
void acknowledge(MPI_Comm comm);
// Collective over the live members of `comm` (revoked or not): their communicator, with
// MPI_ERRORS_RETURN, noted as made (mpi/Comm.hpp). An error names `op` and `rank`.
MPI_Comm shrink(MPI_Comm comm, const char* op, int rank);

// The groups a process failure may concern. `abandon` runs (from any thread) when a failure is
// found in the group: it ends waits outside MPI (the node's shared memory). Keyed by `key` (the
// group object); remove before freeing the communicators.
void addGroup(const void* key, const std::string& name, MPI_Comm comm, MPI_Comm algoComm,
              std::function<void()> abandon);
void removeGroup(const void* key);
// failedRanks of the group registered as `key` (empty when none is).
std::vector<int> failedRanksOf(const void* key);
// Whether a registered group holds a failed process: an error of any class is then taken for the
// failure (Open MPI 5.0.11 gives MPI_ERR_OTHER from MPI_Comm_split_type with a failed member).
bool anyGroupFailed();
// Where ULFM is active, about every 200 ms (the watchdog's pollers): revokes and abandons each
// registered group that holds a failed process, so that its ops fail on every survivor even where
// no MPI call of this process has failed yet (a wait on a live peer that has left the op). Not
// below MPI_THREAD_MULTIPLE (the caller checks).
void pollFailures();
// Called where an MPI call failed with a process failure (isProcessFailure(code)): revokes and
// abandons every registered group with a failed member and returns what to tell the user (which
// ranks of which group failed). A REVOKED error seen before this process learnt which rank
// failed (or a node peer's giving up) waits up to 3 s for it.
std::string onProcessFailure(int code);

}  // namespace mpigpu::mpi::ft
