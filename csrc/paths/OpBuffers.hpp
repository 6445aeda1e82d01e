// The data paths: how one op's tensors meet MPI. OpBuffers is one op's buffers; each device
// type brings its own (paths/Devices.hpp is the seam):
//
//   cpu          MPI on host memory; contiguous tensors used in place (here)
//   via-cpu      any device type without paths of its own (XPU, a PrivateUse1 device, CUDA in a
//                build without CUDA sources): host copies (here)
//   cuda-direct, cuda-staged, cuda-algo   cuda/CudaPaths.cpp
//
// An op adds its tensors as slots (a slot is one flat buffer MPI sees; a list of tensors becomes
// one slot packed back to back), then runs on the engine thread:
//
//   caller thread:  bufs->add(...); bufs->issued(op, rank);
//   engine thread:  auto guard = bufs->enter(); bufs->stageIn(); <MPI on bufs->mpi(i)>;
//                   bufs->stageOut();
//
// and the Work keeps the OpBuffers to order the caller's streams after the op (wait(), future).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/Link.hpp"
#include "algorithms/Reducer.hpp"

namespace mpigpu::paths {

// What MPI does with a slot's memory.
enum class Access { Read, ReadWrite, Write };

// Nanoseconds this process's ops spent at their start (stageIn) waiting for the device work the
// caller had queued: with ranks sharing a GPU, a wait that may cost a switch to this process's
// time slice (the benchmark reports it beside the node algorithm's waits).
void noteStartWaitSince(std::chrono::steady_clock::time_point start);
uint64_t startWaitNs();
// Stream events a device path recorded to order an op against the caller's stream (at issue)
// and its consumers against the op (at its end), and those it left out because the stream had
// already finished its work. Each event is a command on the device: where the ranks share a
// GPU, one queued while a peer's work runs costs a switch between their time slices.
struct OrderEvents {
  uint64_t recorded;
  uint64_t skipped;
};
void noteOrderEvent(bool recorded);
OrderEvents orderEvents();

class OpBuffers {
 public:
  // `path`: the path's name (info(), the debug log): cpu, via-cpu, cuda-direct, ...
  OpBuffers(const char* path, at::Device device) : path_(path), device_(device) {}
  virtual ~OpBuffers() = default;
  OpBuffers(const OpBuffers&) = delete;
  OpBuffers& operator=(const OpBuffers&) = delete;

  const char* pathName() const { return path_; }
  at::Device device() const { return device_; }
  // The op's memory is the caller's host memory, used by MPI as it is: the op may run (or be
  // posted) on the calling thread, with no staging to order (the cpu path).
  virtual bool onCallerMemory() const { return false; }
  // Bytes in all slots (what the op moves on this rank).
  int64_t bytes() const;

  // ---- caller thread ----
  // `users` (all of one dtype, on this op's device) become one flat MPI buffer, back to back in
  // list order. `elementwise` slots (allreduce, broadcast, reduce, send/recv) may be staged in
  // pieces by run() so copies overlap MPI. Returns the slot index.
  size_t add(std::vector<at::Tensor> users, Access access, bool elementwise = false);
  size_t add(const at::Tensor& user, Access access, bool elementwise = false) {
    return add(std::vector<at::Tensor>{user}, access, elementwise);
  }
  // Called once, after the last add(): the op is ordered after what the caller's current stream
  // has queued so far. Throws (naming `op` and `rank`) where the op cannot be issued from here.
  virtual void issued(const char* /*op*/, int /*rank*/) {}

  // ---- engine thread ----
  // Makes the op's device and comm stream current until the guard goes.
  virtual c10::OptionalStreamGuard enter() { return c10::OptionalStreamGuard(); }
  // Fills the MPI buffers of readable slots (except elementwise ones) and waits until they hold
  // the caller's data: after this MPI may read them. Unless deferStartWait() was called: then
  // it only queues, and the op's algorithm waits where another process or MPI first reads.
  virtual void stageIn() = 0;
  // Caller thread, before the op is queued: the op's algorithm waits for the device work itself
  // before anything outside this process's streams touches its memory (the node algorithm in
  // device slots settles before each barrier and each MPI call, its fallback's links before MPI),
  // so stageIn need not. On a GPU that the ranks share, that wait costs a switch to this
  // process's time slice; the leader form's first rank then needs none before its kernel.
  void deferStartWait() { deferStartWait_ = true; }
  // Runs `mpiOn` over an elementwise slot's MPI buffer: whole, or once per consecutive piece
  // where the group cuts them (cutInPieces); paths that stage copy in and out around each piece.
  // Do not call stageIn/stageOut work for this slot yourself.
  virtual void run(size_t slot, c10::function_ref<void(at::Tensor&)> mpiOn);
  // Set by PathFactory before the first add(): elementwise slots go to MPI in pieces of this many
  // bytes (0: whole). Agreed over the group, because MPI's collectives need the same calls with
  // the same counts on every rank, whatever device each rank's tensors are on.
  void cutInPieces(int64_t bytes) { pieceBytes_ = bytes; }
  // Writes writable slots back to the caller's tensors (in stream order on devices) and marks
  // the op's end for the consumers.
  virtual void stageOut() = 0;
  // The flat MPI buffer of a slot (valid after stageIn for non-elementwise slots).
  at::Tensor& mpi(size_t slot) { return slots_[slot].mpi; }
  // After stageOut: drops the tensors and staging memory (the Work may live much longer).
  virtual void release() { slots_.clear(); }

  // ---- our reduction algorithms (engine thread, inside enter()) ----
  // The local reduction step on this op's memory, and how the algorithm's messages of an op of
  // `opBytes` travel (a device path decides between its pointers and host staging).
  virtual std::unique_ptr<algo::Reducer> reducer(c10d::ReduceOp::RedOpType kind) const {
    return algo::makeHostReducer(kind);
  }
  virtual std::unique_ptr<algo::Link> link(const mpi::Comm& comm, const char* op,
                                           int64_t opBytes) const {
    return std::make_unique<algo::Link>(comm, op);
  }

  // ---- Work ----
  // Devices and stream a CUDA-aware future needs (empty / none on host paths).
  virtual std::vector<c10::Device> futureDevices() const { return {}; }
  virtual std::optional<c10::Stream> completionStream() const { return std::nullopt; }
  // Makes the caller's current stream wait for the op's results (after the op completed).
  virtual void orderCurrentStream() const {}

 protected:
  bool deferStartWait_ = false;
  struct Slot {
    std::vector<at::Tensor> users;
    Access access;
    bool elementwise;
    int64_t numel = 0;
    at::Tensor mpi;
    bool aliased = false;   // mpi is the users' own memory: nothing to copy back
    bool deferred = false;  // host path: packed on the engine into the group's reused buffer
    bool readable() const { return access != Access::Write; }
    bool writable() const { return access != Access::Read; }
    // One contiguous tensor whose memory MPI can use as it is (when it lives where MPI reads).
    bool singleContiguous() const { return users.size() == 1 && users[0].is_contiguous(); }
  };
  // Packs the users into one flat tensor / unpacks a flat tensor into the users (on the current
  // stream when on a device; one kernel for several tensors where torch can).
  static at::Tensor packUsers(const Slot& s);
  // When the users already lie back to back in one storage (DDP bucket views, FSDP's flat
  // parameters, slices of one buffer), a flat view of that memory: no packing needed.
  static at::Tensor adjacentView(const Slot& s);
  static void unpackInto(const at::Tensor& flat, const std::vector<at::Tensor>& users,
                         bool nonBlocking);
  // Hook for add(): set up what the path can before the engine runs the op.
  virtual void onAdd(Slot& slot) {}
  // Elements per MPI call of an elementwise slot (its whole length where the group cuts none).
  int64_t pieceNumel(const Slot& s) const;
  // `mpiOn` over `flat` (the slot's MPI buffer) whole or in its pieces.
  void runInPieces(const Slot& s, at::Tensor& flat,
                   c10::function_ref<void(at::Tensor&)> mpiOn) const;

  const char* const path_;
  const at::Device device_;
  c10::SmallVector<Slot, 1> slots_;  // one for most ops: kept inline, no allocation
  int64_t pieceBytes_ = 0;
};

// A host buffer reused by every fused op of one group (paths/OpBuffers.cpp).
struct HostScratch;
std::shared_ptr<HostScratch> makeHostScratch(int64_t keepBytes);
// Host memory: the cpu path for CPU tensors (`device` CPU), via-cpu for any other device type
// (copied to the host on the calling thread at issue, in stream order; back on the engine).
std::shared_ptr<OpBuffers> makeHostOpBuffers(const at::Device& device,
                                             const std::shared_ptr<HostScratch>& scratch);

}  // namespace mpigpu::paths
