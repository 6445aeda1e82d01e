"""What mapping another process's GPU memory costs, and what a kept mapping holds (#22: the leader
form with its peers' tensors mapped, TORCH_MPIGPU_NODE_LEADER=mapped, and the mappings it keeps
across ops, TORCH_MPIGPU_NODE_MAPPED_KEEP; node/KeptMappings.hpp). Two torch processes on one
GPU, CUDA's driver API through ctypes, no MPI, no mpigpu.

    python benchmarks/ipc_mapping_cost.py [--reps 20] [--retention-mib 4096] [--device cuda|cpu]

1. By allocation size, medians of REPS (microseconds): the owner exporting its allocation
   (cuIpcGetMemHandle: every peer, every mapped op), the other process opening it
   (cuIpcOpenMemHandle: a miss of the kept mappings; the first open apart) and closing it. UCX's
   2019 profile on a V100 (rapidsai/ucx-py#334) had 1.33 ms an open and 0.50 ms a close: at that
   cost an op that opens and closes loses to the device slots at every size (cost_model.txt).
2. Retention: the owner frees an allocation the other process still has open. Does the device
   get that memory back at the free, or only at the other's close? Kept mappings of freed memory
   are closed at the owner's next op (its count of freed segments moved); if the memory comes back
   only at the close, a peer's allocator that frees and at once allocates again (its
   out-of-memory retry) cannot use it meanwhile: that is what the answer says.

`--device cpu` runs the same protocol against a pretend driver whose calls do nothing (it checks
the harness; the tests run it so)."""

import argparse
import ctypes
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

LAZY_ENABLE_PEER_ACCESS = 1
MIB = 1 << 20


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]  # (bytes(handle): all 64, zeros included)


def driver(device):
    """libcuda's functions this needs, with their argument types; on `cpu`, calls that succeed
    and do nothing (the device's memory: 80 GiB free, whatever happens)."""
    if device == "cpu":
        def info(free, total):
            free._obj.value = total._obj.value = 80 << 30
            return 0
        return dict.fromkeys(("alloc", "free", "export", "open", "close"), lambda *_: 0) | {"info": info}
    cu = ctypes.CDLL("libcuda.so.1")
    ptr, size = ctypes.c_uint64, ctypes.c_size_t

    def fn(*names, args):
        for name in names:  # (the versioned symbol where cuda.h maps the name to one)
            f = getattr(cu, name, None)
            if f is not None:
                f.argtypes, f.restype = args, ctypes.c_int
                return f
        raise RuntimeError(f"libcuda has none of {names}")

    return {
        "alloc": fn("cuMemAlloc_v2", args=[ctypes.POINTER(ptr), size]),
        "free": fn("cuMemFree_v2", args=[ptr]),
        "export": fn("cuIpcGetMemHandle", args=[ctypes.POINTER(IpcHandle), ptr]),
        "open": fn("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle",
                   args=[ctypes.POINTER(ptr), IpcHandle, ctypes.c_uint]),
        "close": fn("cuIpcCloseMemHandle", args=[ptr]),
        "info": fn("cuMemGetInfo_v2", args=[ctypes.POINTER(size), ctypes.POINTER(size)]),
    }


def check(result, what):
    if result != 0:
        raise RuntimeError(f"{what}: CUresult {result}")


def timed(what, f, *args):
    """f(*args)'s microseconds; raises where it failed."""
    start = time.perf_counter()
    result = f(*args)
    elapsed = (time.perf_counter() - start) * 1e6
    check(result, what)
    return elapsed


def free_mib(cu):
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cu["info"](ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return free.value / MIB


def owner(cu, peer, report, sizes, reps, retention_mib):
    """Allocates and exports to the mapper (`peer`); sends this process's rows to `report`."""
    for size in sizes:
        p, handle = ctypes.c_uint64(), IpcHandle()
        check(cu["alloc"](ctypes.byref(p), size), f"cuMemAlloc({size})")
        exports = [timed("cuIpcGetMemHandle", cu["export"], ctypes.byref(handle), p)
                   for _ in range(reps)]
        peer.send(("map", bytes(handle)))
        first, opened, closed = peer.recv()  # once the mapper has closed its last mapping
        check(cu["free"](p), "cuMemFree")
        report.send((size, exports[0], statistics.median(exports[1:] or exports), first, opened,
                     closed))
    # retention: the mapper holds a mapping while this process frees the memory
    size = int(min(retention_mib, free_mib(cu) / 4)) * MIB
    p, handle = ctypes.c_uint64(), IpcHandle()
    check(cu["alloc"](ctypes.byref(p), size), f"cuMemAlloc({size})")
    check(cu["export"](ctypes.byref(handle), p), "cuIpcGetMemHandle")
    peer.send(("hold", bytes(handle)))
    peer.recv()  # mapped there
    mapped = free_mib(cu)
    check(cu["free"](p), "cuMemFree")
    time.sleep(0.2)
    freed = free_mib(cu)
    peer.send(("close",))
    peer.recv()  # closed there
    time.sleep(0.2)
    closed = free_mib(cu)
    peer.send(("done",))
    report.send((size / MIB, freed - mapped, closed - freed))


def mapper(cu, conn, reps):
    """Opens what the owner exports: the first open, then reps of open + close."""
    held = None
    while True:
        message = conn.recv()
        if message[0] == "map":
            handle = IpcHandle.from_buffer_copy(message[1])
            p = ctypes.c_uint64()
            first = timed("cuIpcOpenMemHandle", cu["open"], ctypes.byref(p), handle,
                          LAZY_ENABLE_PEER_ACCESS)
            check(cu["close"](p), "cuIpcCloseMemHandle")
            opens, closes = [], []
            for _ in range(reps):
                opens.append(timed("cuIpcOpenMemHandle", cu["open"], ctypes.byref(p), handle,
                                   LAZY_ENABLE_PEER_ACCESS))
                closes.append(timed("cuIpcCloseMemHandle", cu["close"], p))
            conn.send((first, statistics.median(opens), statistics.median(closes)))
        elif message[0] == "hold":
            handle = IpcHandle.from_buffer_copy(message[1])
            held = ctypes.c_uint64()
            check(cu["open"](ctypes.byref(held), handle, LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle")
            conn.send(("mapped",))
        elif message[0] == "close":
            check(cu["close"](held), "cuIpcCloseMemHandle (of memory its owner freed)")
            conn.send(("closed",))
        else:
            return


def child(role, conns, device, sizes, reps, retention_mib):
    if device == "cuda":
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")  # the primary context, current on this thread for libcuda
        torch.cuda.synchronize()
    if role == "owner":
        owner(driver(device), *conns, sizes, reps, retention_mib)
    else:
        mapper(driver(device), *conns, reps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sizes-mib", default="2,16,64,256,1024")
    ap.add_argument("--retention-mib", type=int, default=4096)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible: this measures CUDA IPC")
    sizes = [int(s) * MIB for s in args.sizes_mib.split(",")]
    ctx = mp.get_context("spawn")
    owner_end, mapper_end = ctx.Pipe()
    report, rows = ctx.Pipe()
    # daemons: if one fails, the other (waiting on its pipe) must not outlive this process
    procs = [ctx.Process(target=child, args=(role, conns, args.device, sizes, args.reps,
                                                     args.retention_mib),
                         daemon=True)
             for role, conns in (("owner", (owner_end, report)), ("mapper", (mapper_end,)))]
    for proc in procs:
        proc.start()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "pretend driver (harness check)"
    print(f"# {name}: 2 processes, medians of {args.reps} "
          "(first: the first open of a handle), microseconds")
    print(f"{'MiB':>6} {'export first':>13} {'export':>8} {'open first':>11} {'open':>8} {'close':>8}")
    def receive(what):
        """The owner's next row; ends this run at once where either process failed."""
        deadline = time.monotonic() + 120
        while not rows.poll(0.5):
            failed = [proc.exitcode for proc in procs if proc.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                for proc in procs:
                    proc.terminate()
                sys.exit(f"no {what}: " + (f"a process exited with {failed[0]} (its error above)"
                                           if failed else "no answer in 120 s"))
        return rows.recv()

    for _ in sizes:
        size, export_first, export, first, opened, closed = receive("row of timings")
        print(f"{size / MIB:>6.0f} {export_first:>13.1f} {export:>8.1f} {first:>11.1f} "
              f"{opened:>8.1f} {closed:>8.1f}", flush=True)
    held, at_free, at_close = receive("retention answer")
    for proc in procs:
        proc.join(timeout=30)
    print(f"retention: the owner freed {held:.0f} MiB the other process had open: the device's "
          f"free memory {at_free:+.0f} MiB at the free, {at_close:+.0f} MiB at the close")
    if at_close > held / 2:
        print("  -> a mapping holds its owner's freed memory until it is closed")
    elif at_free > held / 2:
        print("  -> the memory came back at the owner's free, the mapping notwithstanding")
    else:
        print("  -> neither reading moved by half the allocation: see the figures")
    if any(proc.exitcode for proc in procs):
        sys.exit(f"exit codes: {[proc.exitcode for proc in procs]}")


if __name__ == "__main__":
    main()
