// The torch headers most translation units include, compiled once per build into a GCC
// precompiled header (setup.py, TORCH_MPIGPU_PRECOMPILED_HEADER): parsing them took ~70% of
// each unit's compile time. Every unit gets this file first (-include); without a usable
// precompiled copy GCC reads it as text, so the build is the same either way, only slower.
// No CUDA or Python headers here: they serve a few units and would grow the file for all.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
