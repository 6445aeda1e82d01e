// CUDA driver functions the runtime does not wrap (stream memory operations, address ranges),
// found through the runtime at first use: the extension does not link libcuda, so that it loads
// where no GPU driver is installed.
#pragma once

#include <string>

namespace mpigpu::cuda {

// The driver's `symbol` (the ABI of CUDA 12.0), or null with why in *missing.
void* driverFunction(const char* symbol, std::string* missing);

}  // namespace mpigpu::cuda
