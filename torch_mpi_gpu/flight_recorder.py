"""mpigpu's flight recorder, from Python.

Every mpigpu op of this process (the last TORCH_FR_BUFFER_SIZE, default 2000; 0 turns recording
off) is recorded with its group, collective and point-to-point numbers, sizes, dtypes, state and
times; with TORCH_MPIGPU_FR_STACKS=1 also the Python stack that issued it. The record is kept in
torch's flight-recorder format, so torch's analyzer reads it:

    python -m torch_mpi_gpu.frtrace /tmp/ -p nccl_trace_rank_   # one file per rank

The watchdog writes every rank's record on a timeout. On demand:

    from torch_mpi_gpu import flight_recorder
    flight_recorder.dump()     # this rank's record, as a dict (torch's format)
    flight_recorder.write()    # to TORCH_FR_DUMP_TEMP_FILE<rank> (torch's writer); returns where

torch's own `torch._C._distributed_c10d._dump_fr_trace()` cannot include mpigpu's ops: torch keeps
its recorder inside libtorch, unreachable for third-party backends.
"""

import pickle

from . import _C

__all__ = ["enabled", "dump", "dump_bytes", "write"]


def enabled() -> bool:
    """Whether ops are being recorded (TORCH_FR_BUFFER_SIZE > 0, read once per process)."""
    return _C.flight_recorder_enabled()


def dump_bytes(stack_traces: bool = True, only_active: bool = False) -> bytes:
    """This rank's record, pickled as torch's recorder writes it (what torchfrtrace reads)."""
    return _C.flight_recorder_dump(stack_traces, only_active)


def dump(stack_traces: bool = True, only_active: bool = False) -> dict:
    """This rank's record: {"version", "comm_lib_version", "pg_config", "pg_status", "entries"};
    each entry as torch's (profiling_name "mpigpu:all_reduce", collective_seq_id, p2p_seq_id,
    input_sizes, input_dtypes, state "scheduled"|"started"|"completed", times, timeout_ms, ...).
    `only_active` leaves out completed ops."""
    return pickle.loads(dump_bytes(stack_traces, only_active))


def write() -> str:
    """Writes this rank's record through torch's DebugInfoWriter (TORCH_FR_DUMP_TEMP_FILE, default
    /tmp/nccl_trace_rank_, plus the world rank; or a writer registered with torch) and returns
    where it went."""
    return _C.flight_recorder_write()
