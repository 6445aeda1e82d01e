#include "mpi/AnySource.hpp"

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

namespace mpigpu::mpi {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

}  // namespace

std::string mpichNetmod(const std::string& text, const char* netmodVariable) {
  // "MPICH Device:       ch4:ucx ofi": the netmods built, the first the default
  const auto line = text.find("MPICH Device:");
  if (line == std::string::npos) return "";
  std::istringstream rest(text.substr(line + 13, text.find('\n', line) - line - 13));
  std::string device;
  rest >> device;
  if (device.rfind("ch4:", 0) != 0) return "";
  if (netmodVariable != nullptr && *netmodVariable != '\0') return lower(netmodVariable);
  const std::string first = device.substr(4);
  return lower(first.substr(0, first.find(',')));
}

AnySourceChoice chooseAnySourceRecv(AnySourceRecv setting) {
  if (setting == AnySourceRecv::Post) return {false, "posted (TORCH_MPIGPU_ANY_SOURCE_RECV=post)"};
  if (setting == AnySourceRecv::Probe) {
    return {true, "by matched probe (TORCH_MPIGPU_ANY_SOURCE_RECV=probe)"};
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(version, &len);
  if (mpichNetmod(std::string(version, len), std::getenv("MPIR_CVAR_CH4_NETMOD")) == "ucx") {
    return {true,
            "by matched probe (auto: MPICH's ucx netmod loses receives posted from any source)"};
  }
  return {false, "posted"};
}

}  // namespace mpigpu::mpi
