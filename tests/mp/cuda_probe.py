"""The CUDA-awareness probe (mpi/DirectProbe.hpp). Everywhere: its exchanges and agreement run
on host buffers through a test hook, right and with one rank's check failed on purpose (every
rank must then agree on the failure and name the rank). With a GPU (MPIGPU_EXPECT_PROBE=passed
or failed): the probe at the first group, what info() says, the path CUDA tensors then take, and
an all_reduce on CUDA tensors still right."""

import os

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, run


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(f"cuda_probe(np={world})")

    c.section("the probe's exchanges and agreement, host buffers")
    ok, detail, seconds = torch_mpi_gpu._C._direct_probe()
    c.true("right bytes: passed on every rank", ok and f"came back right on {world} rank" in detail,
           detail)
    c.true("its cost is measured", 0 < seconds < 60, f"{seconds} s")
    bad = world - 1
    ok, detail, _ = torch_mpi_gpu._C._direct_probe(corrupt=rank == bad)
    c.true("one rank's failure: failed on every rank", not ok, detail)
    want = f"rank {bad}: TORCH_MPIGPU_TEST_CUDA_PROBE_FAILS=1" if rank == bad else f"rank {bad} saw wrong bytes"
    c.true("the detail names the rank that saw it", detail.startswith(want), detail)

    expect = os.environ.get("MPIGPU_EXPECT_PROBE")
    status = torch_mpi_gpu._C.mpi_info()["cuda_aware_probe"]
    if not expect:
        if torch.cuda.is_available():  # the group has a GPU: test_gpu.py checks the probe there
            return c.finish()
        c.section("no group with a GPU: the probe has not run")
        c.true("info says so", status.startswith("not run"), status)
        return c.finish()

    c.section("the probe at the first group with a GPU")
    torch_mpi_gpu.select_cuda_device()
    c.true(f"info: {expect}", status.startswith(expect + ":"), status)
    described = dist.group.WORLD._get_backend(torch.device("cuda")).describe()
    staged = "probe saw wrong bytes" in described
    c.true("CUDA tensors staged exactly when it failed", staged == (expect == "failed"), described)
    t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    c.true("all_reduce on CUDA tensors right", bool((t == world * (world + 1) / 2).all().item()),
           str(t[:4]))
    return c.finish()


if __name__ == "__main__":
    run(main)
