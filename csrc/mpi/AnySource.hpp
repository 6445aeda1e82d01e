// How a receive from any source (torch's recv with src=None) meets MPI
// (TORCH_MPIGPU_ANY_SOURCE_RECV):
//   post   MPI_Irecv(MPI_ANY_SOURCE): the library matches it.
//   probe  a matched probe: the engine asks MPI_Improbe for the next message of the tag and
//          receives it with MPI_Imrecv; a later receive of the same tag on the same group waits
//          until that one is matched, so messages go to receives in MPI's own order (the
//          standard's non-overtaking rule) and nothing that could complete the held receive is
//          held back behind it.
// auto takes probe where the library is known to lose MPI_Irecv(MPI_ANY_SOURCE) completions:
// MPICH's ch4 ucx netmod (5.0.2, in plain C too: after a few messages from another host,
// or from this one with MPIR_CVAR_NOLOCAL=1, the receive never completes; MPI_Improbe sees the
// message and the ofi netmod is fine). Everywhere else, post.
#pragma once

#include <string>

#include "core/Config.hpp"

namespace mpigpu::mpi {

struct AnySourceChoice {
  bool probe = false;
  std::string why;  // the group's description
};

// Reads the library's full version string (and MPIR_CVAR_CH4_NETMOD); MPI must be initialised.
AnySourceChoice chooseAnySourceRecv(AnySourceRecv setting);

// The MPICH ch4 netmod in use, from the library's version text and MPIR_CVAR_CH4_NETMOD ("" when
// the library is not MPICH's ch4 device). Exposed for the tests.
std::string mpichNetmod(const std::string& libraryVersionText, const char* netmodVariable);

}  // namespace mpigpu::mpi
