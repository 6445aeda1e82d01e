"""Reproduces torch 2.11's missing CUDA uint16/32/64 kernels on CPU tensors, under a tests/mp script.

Runs a tests/mp script with torch 2.11's CUDA gaps for uint16/32/64 emulated on CPU tensors: the
ops the lent H200 lacked for them (add, mul, minimum, bitwise_and, foreach copy:
benchmarks/results/2026-11-28_h200_cuda-uint-diag/diag.log) and their kin raise, as there.
Catches test-side arithmetic on those dtypes, not mpigpu's own (a dispatch mode is per Python
thread; the engine's C++ thread does not see it).

    cd tests/mp && mpirun -np 2 python ../../benchmarks/repro/emulate_cuda_uint_gaps.py collectives.py
"""
import runpy
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

UNSIGNED = {torch.uint16, torch.uint32, torch.uint64}
MISSING = {"add", "sub", "mul", "div", "minimum", "maximum", "bitwise_and", "bitwise_or", "bitwise_xor",
           "_foreach_copy", "clamp", "neg", "remainder", "fmod", "min", "max", "lt", "gt", "le", "ge",
           "where", "prod", "cumsum"}


class CudaUintGaps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0].rstrip("_") in MISSING:
            dtypes = [t.dtype for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if UNSIGNED & set(dtypes):
                raise NotImplementedError(f"emulated torch 2.11 CUDA gap: {func} for {dtypes}")
        return func(*args, **(kwargs or {}))


if __name__ == "__main__":
    CudaUintGaps().__enter__()
    sys.argv = sys.argv[1:]
    sys.path.insert(0, ".")
    runpy.run_path(sys.argv[0], run_name="__main__")
