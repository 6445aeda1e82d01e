#include "paths/Devices.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

#include "mpi/Check.hpp"
#include "mpi/Wait.hpp"

namespace mpigpu::paths {
namespace {

struct Registered {
  DevicePathsFactory paths;
  ReducerFactory reducer;
};

// Function-local: registrations run during static initialisation, in any order.
std::map<c10::DeviceType, Registered>& registry() {
  static std::map<c10::DeviceType, Registered> devices;
  return devices;
}

const Registered* find(c10::DeviceType type) {
  auto it = registry().find(type);
  return it == registry().end() ? nullptr : &it->second;
}

PathChoice viaCpu(c10::DeviceType type) {
  return {"via-cpu",
          c10::str("this build has no paths of its own for ", c10::DeviceTypeName(type, true),
                   " tensors; they are copied through host memory on the calling thread",
                   type == c10::DeviceType::CUDA
                       ? " (rebuild with a CUDA torch, CUDA_HOME set and TORCH_MPIGPU_WITH_CUDA=1)"
                       : "")};
}

const char* useName(Use use) {
  switch (use) {
    case Use::Move: return "tensors";
    case Use::Reduce: return "reductions";
    case Use::Algorithm: return "reductions by our algorithms";
  }
  return "?";
}

}  // namespace

DevicePathsRegistration::DevicePathsRegistration(c10::DeviceType type, DevicePathsFactory paths,
                                                 ReducerFactory reducer) {
  TORCH_INTERNAL_ASSERT(type != c10::DeviceType::CPU && !find(type),
                        "mpigpu: paths for device type ", c10::DeviceTypeName(type),
                        " registered twice (or for the built-in CPU)");
  registry()[type] = {std::move(paths), std::move(reducer)};
}

PathFactory::PathFactory(const Config& config)
    // Big enough for a full fusion bucket; larger one-off packs get a temporary buffer.
    : hostScratch_(makeHostScratch(std::max<int64_t>(config.fusionBytes, 1 << 20))),
      testHostPieceBytes_(config.testHostPieceBytes) {
  for (const auto& [type, registered] : registry()) devices_[type] = registered.paths(config);
}

std::shared_ptr<OpBuffers> PathFactory::create(const at::Device& device, Use use) {
  auto it = devices_.find(device.type());
  // the cpu path built in; via-cpu for a device without paths of its own
  auto bufs = !device.is_cpu() && it != devices_.end() ? it->second->create(device, use)
                                                       : makeHostOpBuffers(device, hostScratch_);
  bufs->cutInPieces(use == Use::Move     ? movePieceBytes_
                    : use == Use::Reduce ? reducePieceBytes_
                                         : 0);
  return bufs;
}

void PathFactory::confirm(const mpi::Comm& group, bool anyGpu, const char* op) {
  for (auto& [type, paths] : devices_) paths->confirm(group, anyGpu, op);
  agreePieces(group, op);
}

void PathFactory::agreePieces(const mpi::Comm& group, const char* op) {
  int64_t pieces[2] = {testHostPieceBytes_, testHostPieceBytes_};  // {moves, MPI's reductions}
  for (const auto& [type, paths] : devices_) {
    pieces[0] = std::max(pieces[0], paths->pieceBytes(Use::Move));
    pieces[1] = std::max(pieces[1], paths->pieceBytes(Use::Reduce));
  }
  mpi::arriveTogether(group, op);
  MPIGPU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, pieces, 2, MPI_INT64_T, MPI_MAX, group.handle), op,
                   group.rank);
  movePieceBytes_ = pieces[0];
  reducePieceBytes_ = pieces[1];
}

node::DeviceSlotsMaker PathFactory::nodeSlots(c10::DeviceType type) const {
  auto it = devices_.find(type);
  return it == devices_.end() ? nullptr : it->second->nodeSlots();
}

std::string PathFactory::nodeDeviceId(c10::DeviceType type) const {
  auto it = devices_.find(type);
  return it == devices_.end() ? "" : it->second->nodeDeviceId();
}

std::string PathFactory::describe() const {
  std::ostringstream s;
  s << "cpu tensors cpu";
  for (const auto& [type, paths] : devices_) {
    const std::string name = c10::DeviceTypeName(type, true);
    for (Use use : {Use::Move, Use::Reduce, Use::Algorithm}) {
      const PathChoice c = paths->choice(use);
      s << ", " << name << " " << useName(use) << " " << c.name << " (" << c.reason << ")";
    }
  }
  s << ", other devices via-cpu";
  if (movePieceBytes_ > 0 || reducePieceBytes_ > 0) {
    s << "; every rank cuts broadcast into MPI calls of " << movePieceBytes_
      << " bytes and all_reduce/reduce by MPI's own into " << reducePieceBytes_
      << " bytes (0: whole), as a member's staging pipeline does";
  }
  return s.str();
}

PathChoice describePath(c10::DeviceType type, Use use, const Config& config) {
  if (type == c10::DeviceType::CPU) return {"cpu", "MPI on host memory"};
  const Registered* registered = find(type);
  return registered ? registered->paths(config)->choice(use) : viaCpu(type);
}

std::unique_ptr<algo::Reducer> makeReducer(c10::DeviceType type, c10d::ReduceOp::RedOpType kind) {
  if (type == c10::DeviceType::CPU) return algo::makeHostReducer(kind);
  const Registered* registered = find(type);
  TORCH_CHECK_VALUE(registered, "mpigpu: ", c10::DeviceTypeName(type, true),
                    " tensors have no reducer of their own in this build (via-cpu reduces them on "
                    "the host)");
  return registered->reducer(kind);
}

}  // namespace mpigpu::paths
