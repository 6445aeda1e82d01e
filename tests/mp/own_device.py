"""The tests' own device (own_device.cpp): torch's PrivateUse1 named `owndev`, host memory
behind a device type of its own, so mpigpu's path for devices other than CPU and CUDA (XPU and the
like) is run for real. build() compiles it once per session (the pytest process, through
torch.utils.cpp_extension; a minute on 2 cores) and returns the library's path; load() in each
rank loads that library (MPIGPU_OWN_DEVICE_LIB), names the device and has mpigpu serve it."""

import os
import types
from pathlib import Path

import torch

NAME = "owndev"
SOURCE = Path(__file__).with_name("own_device.cpp")


def build(build_dir):
    from torch.utils.cpp_extension import load
    Path(build_dir).mkdir(parents=True, exist_ok=True)
    load(name="mpigpu_own_device", sources=[str(SOURCE)], build_directory=str(build_dir),
         is_python_module=False, verbose=False)
    return str(Path(build_dir) / "mpigpu_own_device.so")


def _module():
    # what torch asks of a device module (torch.owndev): one device, always there
    m = types.ModuleType(NAME)
    m.is_available = lambda: True
    m.device_count = lambda: 1
    m.current_device = lambda: 0
    m.set_device = lambda device: None
    m.is_initialized = lambda: True
    m._is_in_bad_fork = lambda: False
    m.manual_seed_all = lambda seed: None
    m.synchronize = lambda device=None: None
    return m


def load():
    """Loads the built device into this process, once; returns torch.device("owndev")."""
    if torch._C._get_privateuse1_backend_name() != NAME:
        torch.ops.load_library(os.environ["MPIGPU_OWN_DEVICE_LIB"])
        torch.utils.rename_privateuse1_backend(NAME)
        torch._register_device_module(NAME, _module())
        import torch_mpi_gpu
        torch_mpi_gpu.serve_device(NAME)
    return torch.device(NAME, 0)


def allocations():
    """Tensors allocated on the device so far in this process."""
    return torch.ops.mpigpu_test_device.allocations()
