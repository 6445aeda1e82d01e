// Whether the MPI library moves the bytes of device buffers right. Libraries say they are
// CUDA-aware (MPIX_Query_cuda_support) and then crash or return wrong bytes: Cray MPICH without
// its GPU transport layer or without MPICH_GPU_SUPPORT_ENABLED=1, MVAPICH without MV2_USE_CUDA=1,
// an Open MPI whose CUDA support is off at run time. So the first group with a GPU, where the
// library claims support, checks a few real exchanges before any tensor takes that path
// (cuda/CudaPaths.cpp: confirm) and stages through host memory where they come back wrong.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "mpi/Collectives.hpp"

namespace mpigpu::mpi {

struct ProbeOutcome {
  bool ok = false;     // every rank of the group saw the expected bytes
  std::string detail;  // what was checked, or what went wrong (and on which rank)
  double seconds = 0;  // the probe's cost, at group creation
};

// Collective over `comm`. Each rank's buffers live on `device` (its GPU, or the host for a rank
// that has none or passes host memory anyway): a ring send/recv of a small and a 1 MiB message
// (the eager and rendezvous protocols) and an all-gather, each compared on the host with the
// expected bytes; the outcome is agreed, so every rank falls back together. `corrupt`
// (TORCH_MPIGPU_TEST_CUDA_PROBE_FAILS=1, tests only): this rank's check fails on purpose. A crash
// inside MPI during the probe first prints what to set, then goes on as the crash would have.
ProbeOutcome probeDirect(const Comm& comm, const at::Device& device, bool corrupt, const char* op);

// What to set so this library takes device pointers (from its MPI_Get_library_version).
std::string cudaSupportFix(const std::string& libraryVersion);

// info(): this process's probe result, or why none ran.
void recordProbe(const std::string& status);
std::string probeStatus();

}  // namespace mpigpu::mpi
