#include "cuda/DriverApi.hpp"

#include <c10/util/StringUtil.h>
#include <cuda_runtime_api.h>

namespace mpigpu::cuda {

void* driverFunction(const char* symbol, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found);
  if (e == cudaSuccess && found == cudaDriverEntryPointSuccess && p != nullptr) return p;
  (void)cudaGetLastError();
  *missing = c10::str("this CUDA driver does not give ", symbol, " (",
                      e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found", ")");
  return nullptr;
}

}  // namespace mpigpu::cuda
