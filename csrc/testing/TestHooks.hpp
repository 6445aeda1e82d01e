// The unit tests' hooks into each layer (csrc/testing/TestHooks.cpp), bound into the extension
// module next to its public bindings (csrc/init.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace mpigpu::testing {

void bindTestHooks(pybind11::module_& m);

}  // namespace mpigpu::testing
