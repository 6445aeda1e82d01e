"""Shared helpers for the multi-rank test scripts (run under mpirun by tests/test_*.py).

Inputs are derived from (seed, rank), so every rank can compute every other rank's input and
hence an independent float64 reference for the result, without trusting the backend.
"""

import os
import sys
import traceback

import torch
import torch.distributed as dist

# MPIGPU_TEST_THREAD_LEVEL=serialized: mpi4py initialises MPI at that level first, so every
# group shares one engine thread (the path of MPIs without MPI_THREAD_MULTIPLE).
THREAD_LEVEL = os.environ.get("MPIGPU_TEST_THREAD_LEVEL")
if THREAD_LEVEL:
    import mpi4py

    mpi4py.rc.thread_level = THREAD_LEVEL
    from mpi4py import MPI  # noqa: F401

import torch_mpi_gpu  # noqa: E402  (registers mpigpu)

if THREAD_LEVEL:
    granted = torch_mpi_gpu._C.mpi_info()["thread_level"]
    if granted != f"MPI_THREAD_{THREAD_LEVEL.upper()}":  # else the test would test another path
        raise RuntimeError(f"MPIGPU_TEST_THREAD_LEVEL={THREAD_LEVEL} but MPI granted {granted}")

# Set by tests/conftest.py's repeat mode (MPIGPU_TEST_REPEAT): run i draws other inputs; a
# failure prints the offset, and the same value replays it.
SEED_OFFSET = int(os.environ.get("MPIGPU_TEST_SEED_OFFSET", "0"))

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]


def use_test_device():
    """Put this rank's tensors on the device MPIGPU_TEST_DEVICE names (call after init):
    cpu (default), cuda, or mixed (rank 0 on CUDA, the other ranks on CPU, in one collective).
    Factory calls without a device then land there, so one script tests every path."""
    want = os.environ.get("MPIGPU_TEST_DEVICE", "cpu")
    if want == "mixed":
        want = "cuda" if dist.get_rank() == 0 else "cpu"
    device = torch.device("cuda", torch.cuda.current_device()) if want == "cuda" else torch.device(want)
    torch.set_default_device(device)
    expect = os.environ.get("MPIGPU_EXPECT_PATH")
    if device.type == "cuda" and expect:
        import torch_mpi_gpu
        taken = torch_mpi_gpu._C.cuda_path()[0]
        if taken != expect:  # a test of one path must not silently run another
            raise RuntimeError(f"CUDA tensors take {taken}, this run expects {expect}")
        expect_reduce = os.environ.get("MPIGPU_EXPECT_REDUCE_PATH")
        taken = torch_mpi_gpu._C.cuda_reduce_path()[0]
        if expect_reduce and taken != expect_reduce:
            raise RuntimeError(f"CUDA reductions take {taken}, this run expects {expect_reduce}")
    return device


def _host(fn, *args, **kwargs):
    return fn(*args, device="cpu", **kwargs)


def make_input(seed, rank, numel, dtype, kind="any"):
    """Deterministic tensor for (seed, rank): every rank can rebuild every other rank's input.
    Drawn on the host (the same numbers on every device), then moved to the test device."""
    g = torch.Generator().manual_seed((seed + SEED_OFFSET) * 1009 + rank * 7919 + numel)
    if dtype == torch.bool:
        t = _host(torch.randint, 0, 2, (numel,), generator=g).bool()
    elif dtype.is_floating_point:
        if kind == "prod":  # near 1 so products stay representable
            t = (0.75 + 0.5 * _host(torch.rand, numel, generator=g, dtype=torch.float64)).to(dtype)
        else:
            t = (4 * _host(torch.rand, numel, generator=g, dtype=torch.float64) - 2).to(dtype)
    else:
        lo, hi = (0, 100) if dtype == torch.uint8 else (-50, 50)
        if kind == "prod":
            lo, hi = (1, 3)
        t = _host(torch.randint, lo, hi, (numel,), generator=g, dtype=torch.int64).to(dtype)
    return t.to(torch.get_default_device())


def reference_reduce(op, inputs, dtype, factor=None):
    """Reduce a list of per-rank tensors in float64/int64 (independent of the backend)."""
    if dtype == torch.bool:
        stack = torch.stack([t.bool() for t in inputs])
        if op in ("sum", "max", "bor"):
            return stack.any(0)
        if op in ("product", "min", "band"):
            return stack.all(0)
        if op == "bxor":
            return (stack.sum(0) % 2).bool()
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([t.to(wide) for t in inputs])
    if op == "sum":
        return stack.sum(0)
    if op == "avg":
        return stack.sum(0) / len(inputs)
    if op == "premul_sum":
        return (stack * factor).sum(0)
    if op == "product":
        return stack.prod(0)
    if op == "min":
        return stack.min(0).values
    if op == "max":
        return stack.max(0).values
    out = stack[0].clone()
    for t in stack[1:]:
        out = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op](out, t)
    return out


def tolerance(dtype, world):
    # Float results depend on the reduction order; the bound grows with the number of terms.
    eps = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1.2e-7, torch.float64: 2.3e-16}
    e = eps.get(dtype, 0.0)
    return 4 * e * max(world, 1), 4 * e * max(world, 1) * 4


class Checker:
    """Collects failures instead of stopping at the first, then reports them all."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failures = []
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        # behaviour -> [passed, failed]; checks before the first section() count as `name`
        self.current = "main"
        self.behaviours = {}

    def section(self, behaviour):
        """Name the behaviour the checks from here on test. The driver compares the behaviours
        each rank reports with the set it expects, so a section that stops running (or runs no
        check) fails by name instead of lowering a count."""
        self.current = behaviour
        self.behaviours.setdefault(behaviour, [0, 0])

    def _tally(self, ok, failure=None):
        counts = self.behaviours.setdefault(self.current, [0, 0])
        if ok:
            self.passed += 1
            counts[0] += 1
        else:
            self.failures.append(f"[{self.current}] {failure}")
            counts[1] += 1

    def absorb(self, other):
        """Adds another Checker's results (one per thread) to this one's."""
        self.passed += other.passed
        self.failures += other.failures
        for behaviour, (passed, failed) in other.behaviours.items():
            counts = self.behaviours.setdefault(behaviour, [0, 0])
            counts[0] += passed
            counts[1] += failed

    def close(self, case, got, expected, dtype=None, world=1):
        dtype = dtype or got.dtype
        got, expected = got.cpu(), expected.cpu()
        try:
            if got.dtype != dtype:
                raise AssertionError(f"dtype {got.dtype} != {dtype}")
            if got.shape != expected.shape:
                expected = expected.reshape(got.shape)
            if dtype.is_floating_point or dtype.is_complex:
                rtol, atol = tolerance(dtype, world)
                torch.testing.assert_close(got.to(torch.float64), expected.to(torch.float64),
                                           rtol=rtol, atol=atol)
            else:
                # integer arithmetic wraps in the tensor's dtype, as torch's own ops do
                expected = expected.to(dtype)
                if not torch.equal(got.to(torch.int64), expected.to(torch.int64)):
                    diff = (got.to(torch.int64) != expected.to(torch.int64)).sum().item()
                    raise AssertionError(f"{diff} of {got.numel()} elements differ: "
                                         f"got {got.flatten()[:8].tolist()} expected "
                                         f"{expected.flatten()[:8].tolist()}")
            self._tally(True)
        except AssertionError as e:
            self._tally(False, f"{case}: {e}")

    def true(self, case, cond, detail=""):
        if cond:
            self._tally(True)
        else:
            self._tally(False, f"{case}: {detail}")

    def raises(self, case, exc_type, fn, must_contain=()):
        try:
            fn()
        except exc_type as e:
            msg = str(e)
            missing = [s for s in must_contain if s not in msg]
            if missing:
                self._tally(False, f"{case}: message lacks {missing}: {msg[:300]}")
            else:
                self._tally(True)
            return
        except Exception as e:  # noqa: BLE001
            self._tally(False, f"{case}: raised {type(e).__name__} instead of "
                               f"{exc_type.__name__}: {str(e)[:300]}")
            return
        self._tally(False, f"{case}: did not raise {exc_type.__name__}")

    def finish(self):
        world = dist.get_world_size() if dist.is_initialized() else 1
        for f in self.failures[:50]:
            print(f"[rank {self.rank}] FAIL {self.name}: {f}", flush=True)
        if self.failures:
            print(f"[rank {self.rank}] replay with MPIGPU_TEST_SEED_OFFSET={SEED_OFFSET}", flush=True)
        # one line per behaviour, read by tests/conftest.py (passed_counts)
        # (a section that made no check is left out: the driver then reports it as not run)
        for behaviour, (passed, failed) in self.behaviours.items():
            if passed + failed == 0:
                continue
            print(f'[rank {self.rank}/{world}] behaviour "{behaviour}": {passed} passed, '
                  f'{failed} failed', flush=True)
        print(f"[rank {self.rank}/{world}] {self.name}: {self.passed} checks passed, "
              f"{len(self.failures)} failed", flush=True)
        return 1 if self.failures else 0


def run(main):
    """Run a test body on every rank; any failure or exception exits non-zero (mpirun then aborts
    the job)."""
    try:
        code = main()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        sys.stdout.flush()
        code = 1
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(code) if code else sys.exit(0)
