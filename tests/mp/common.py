"""Shared helpers for the multi-rank test scripts (run under mpirun by tests/test_*.py).

Inputs are derived from (seed, rank), so every rank can compute every other rank's input and
hence an independent float64 reference for the result, without trusting the backend.
"""

import os
import sys
import time
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

# MPIGPU_TEST_ONLY_RANK0_CROWDED=1: rank 0 alone waits as a rank of a crowded host does (more
# ranks than cores), the others as ranks with a core each: a job across hosts that differ so.
# Every collective that begins with an arrival barrier must agree on it over its communicator.
ONLY_RANK0_CROWDED = os.environ.get("MPIGPU_TEST_ONLY_RANK0_CROWDED") == "1"
if ONLY_RANK0_CROWDED:
    torch_mpi_gpu._C.set_oversubscribed((torch_mpi_gpu.detect_launcher() or {}).get("rank") == 0)

# MPIGPU_TEST_DEVICE=own...: the tests' own device (own_device.py), served by mpigpu before any
# group exists (torch fixes a group's device types when it creates it)
TEST_DEVICE = os.environ.get("MPIGPU_TEST_DEVICE", "cpu")
if TEST_DEVICE.startswith("own"):
    import own_device

    own_device.load()

# Set by tests/conftest.py's repeat mode (MPIGPU_TEST_REPEAT): run i draws other inputs; a
# failure prints the offset, and the same value replays it.
SEED_OFFSET = int(os.environ.get("MPIGPU_TEST_SEED_OFFSET", "0"))

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16,
              torch.uint32, torch.uint64]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]


def use_test_device():
    """Put this rank's tensors on the device MPIGPU_TEST_DEVICE names (call after init):
    cpu (default), cuda, mixed (rank 0 on CUDA, the other ranks on CPU, in one collective), own
    (the tests' own PrivateUse1 device, own_device.py), own-mixed (own on even ranks, CPU on odd),
    own-cuda-cpu (own, CUDA and CPU ranks by rank mod 3).
    Factory calls without a device then land there, so one script tests every path."""
    want, rank = TEST_DEVICE, dist.get_rank()
    if want == "mixed":
        want = "cuda" if rank == 0 else "cpu"
    elif want == "own-mixed":  # the tests' own device on even ranks, CPU on odd ones
        want = "own" if rank % 2 == 0 else "cpu"
    elif want == "own-cuda-cpu":  # own device, CUDA and CPU ranks in one collective
        want = ("own", "cuda", "cpu")[rank % 3]
    if want == "own":
        device = torch.device("owndev", 0)
        import torch_mpi_gpu
        taken = torch_mpi_gpu._C.device_path("owndev")[0]
        if taken != "via-cpu":  # the device stands for XPU and the like: no paths of its own
            raise RuntimeError(f"the tests' own device takes {taken}, not via-cpu")
    elif want == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device(want)
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
        # the dtype's whole range, so SUM and PRODUCT wrap (the reference wraps the same way);
        # uint64 below 2^63, where the int64 reference still orders MIN/MAX right
        info = torch.iinfo(dtype)
        lo, hi = info.min, min(info.max, 2 ** 63 - 2) + 1
        t = _host(torch.randint, lo, hi, (numel,), generator=g, dtype=torch.int64).to(dtype)
    device = torch.get_default_device()
    if device.type != "cuda":
        return t.to(device)
    # Queued behind the current stream's work, not waited for: on a GPU that processes share,
    # each wait costs a switch of time slices (~10 ms with the GPU suite's workers at once,
    # 2026-12-04), and the suite's own waits were most of its run time. The host original stays
    # with it, so references and bounds are computed on the host (host_original).
    moved = t.pin_memory().to(device, non_blocking=True)
    moved.host_original = t
    return moved


def host_original(tensors):
    """The host tensors make_input drew `tensors` from, where it made all of them; else the
    tensors themselves."""
    originals = [getattr(t, "host_original", None) for t in tensors]
    return tensors if any(o is None for o in originals) else originals


def reference_reduce(op, inputs, dtype, factor=None):
    """Reduce a list of per-rank tensors in float64/int64 (independent of the backend)."""
    inputs = host_original(inputs)
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


# Unit roundoff of each float dtype (half the distance from 1 to the next value): the relative
# error of one rounding.
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24,
                 torch.float64: 2.0 ** -53}


def reduction_bound(op, inputs, dtype, factor=None):
    """Per element, how far a correct reduction of `inputs` computed in `dtype` may be from the
    exact value (reference_reduce): p - 1 additions in any order each round once, by at most u
    times the running sum's magnitude, so at most (p - 1) u sum|x_i|; a prescale (PREMUL_SUM), an
    AVG's division and the final rounding add at most u each: (p + 2) u sum|x_i| covers them.
    A PRODUCT's p - 1 roundings are relative: (p + 1) u |prod x_i|. MIN and MAX are exact. Small
    enough that leaving out one rank's contribution, or an AVG divided by the wrong count, fails
    (tests/test_reporting.py checks that on every float dtype at 2-5 ranks). None for integers
    (compared exactly)."""
    if not dtype.is_floating_point:
        return None
    u, p = UNIT_ROUNDOFF[dtype], len(inputs)
    mags = torch.stack([t.detach().to("cpu", torch.float64).abs() for t in host_original(inputs)])
    if op in ("min", "max"):
        return torch.zeros_like(mags[0])
    if op == "product":
        return (p + 1) * u * mags.prod(0)
    if op == "premul_sum":
        mags = mags * abs(float(factor))
    total = (p + 2) * u * mags.sum(0)
    return total / p if op == "avg" else total


def reduced(op, inputs, dtype, factor=None):
    """(expected, bound): reference_reduce and reduction_bound of the same inputs."""
    return reference_reduce(op, inputs, dtype, factor), reduction_bound(op, inputs, dtype, factor)


def tolerance(dtype, world):
    # Only for results that are not one reduction (a model trained on several ranks against one
    # process): the bound grows with the number of ranks. Reductions pass reduction_bound.
    eps = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1.2e-7, torch.float64: 2.3e-16,
           torch.complex64: 1.2e-7, torch.complex128: 2.3e-16}
    e = eps.get(dtype, 0.0)
    return 4 * e * max(world, 1), 4 * e * max(world, 1) * 4


def _deferrable(t):
    return isinstance(t, torch.Tensor) and t.device.type != "cpu" and t.layout == torch.strided


def _read_back(t):
    """A host copy of `t` as it stands now in the current stream's order. From CUDA: into pinned
    memory without waiting (the copy is done at the next synchronize), the block kept from reuse
    on its own stream until then. Elsewhere (host tensors, sparse ones, other devices): a copy
    now."""
    if t is None:
        return None
    if t.device.type == "cuda" and t.layout == torch.strided and t.numel():
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        host.copy_(t, non_blocking=True)
        t.record_stream(torch.cuda.current_stream(t.device))
        return host
    return t.to("cpu", copy=True)


def startup_seconds(now):
    """Where a launch's time went before its first check (tests/mp/start.py's marks): importing
    torch, then the rest (the script's imports, init_process_group, its device)."""
    started, imported = (os.environ.get(k) for k in ("MPIGPU_TEST_T0", "MPIGPU_TEST_T_TORCH"))
    if not (started and imported):
        return {}
    return {"start: import torch": float(imported) - float(started),
            "start: init and device": now - float(imported)}


class Checker:
    """Collects failures instead of stopping at the first, then reports them all.

    skip(case, reason): a check that does not apply on this rank or at this size (no peer at one
    rank, not a member of the subgroup) is reported as skipped, never counted as passed: the driver
    (tests/conftest.py, passed_counts) skips a test whose every check was skipped and lists the
    skipped checks of the others in pytest's summary.

    defer_device_reads=True: close() on device tensors queues their copies to the host behind
    the work in flight and compares them at the next section() or finish() (or every
    DEFERRED_BYTES), after one wait, instead of waiting for the device at every check: on a GPU
    that processes share each wait costs a switch of time slices. For scripts that write the
    tensors they check only on the current stream or through collectives (which order
    themselves after it): a later write from another stream would race the copy."""

    DEFERRED_BYTES = 64 << 20

    def __init__(self, name, defer_device_reads=False):
        self.name = name
        self.passed = 0
        self.failures = []
        # behaviour -> ["case: reason", ...] of the checks skip() left out
        self.skipped = {}
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        # (scripts that end their group before finish() still report their world's size)
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        # behaviour -> [passed, failed]; checks before the first section() count as `name`
        self.current = "main"
        self.behaviours = {}
        # seconds per section, printed by finish(): where a script's time goes on a machine we
        # hold for minutes (the lent GPU) without rerunning it
        self.seconds = {}
        self.since = time.monotonic()
        self.seconds.update(startup_seconds(self.since))
        self.defer_device_reads = defer_device_reads
        self.deferred, self.deferred_bytes = [], 0

    def section(self, behaviour):
        """Name the behaviour the checks from here on test. The driver compares the behaviours
        each rank reports with the set it expects, so a section that stops running (or runs no
        check) fails by name instead of lowering a count."""
        self.compare_deferred()
        self._clock()
        self.current = behaviour
        self.behaviours.setdefault(behaviour, [0, 0])

    def _clock(self):
        now = time.monotonic()
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self.since
        self.since = now

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
        other.compare_deferred()
        self.passed += other.passed
        self.failures += other.failures
        for behaviour, (passed, failed) in other.behaviours.items():
            counts = self.behaviours.setdefault(behaviour, [0, 0])
            counts[0] += passed
            counts[1] += failed
        for behaviour, skipped in other.skipped.items():
            self.skipped.setdefault(behaviour, []).extend(skipped)

    def close(self, case, got, expected, dtype=None, world=1, bound=None):
        """got must equal expected: in shape and dtype always; in value within `bound` (per
        element, from reduction_bound) for a float reduction, within tolerance(dtype, world)
        for other float results computed on several ranks (world > 1), exactly otherwise (data
        movement, integers: they wrap in their dtype, as torch's ops do)."""
        dtype = dtype or got.dtype
        if self.defer_device_reads and any(_deferrable(t) for t in (got, expected, bound)):
            copies = [_read_back(t) for t in (got, expected, bound)]
            self.deferred.append((self.current, case, *copies, dtype, world))
            self.deferred_bytes += sum(t.numel() * t.element_size() for t in copies if t is not None)
            if self.deferred_bytes >= self.DEFERRED_BYTES:
                self.compare_deferred()
            return
        self._compare(case, got, expected, dtype, world, bound)

    def compare_deferred(self):
        """Waits once for the copies close() queued, then compares each under its section."""
        if not self.deferred:
            return
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        deferred, self.deferred, self.deferred_bytes = self.deferred, [], 0
        current = self.current
        for section, case, got, expected, bound, dtype, world in deferred:
            self.current = section
            self._compare(case, got, expected, dtype, world, bound)
        self.current = current

    def _compare(self, case, got, expected, dtype, world, bound):
        got, expected = got.cpu(), expected.cpu()
        try:
            if got.dtype != dtype:
                raise AssertionError(f"dtype {got.dtype} != {dtype}")
            if got.shape != expected.shape:
                raise AssertionError(f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}")
            if (dtype.is_floating_point or dtype.is_complex) and (bound is not None or world > 1):
                if bound is not None:
                    self._within(got, expected, bound)
                else:
                    self._near(got, expected, *tolerance(dtype, world))
            else:
                if not (dtype.is_floating_point or dtype.is_complex):
                    expected = expected.to(dtype)
                if not torch.equal(got, expected.to(got.dtype)):
                    differ = got != expected.to(got.dtype)
                    raise AssertionError(f"{int(differ.sum())} of {got.numel()} elements differ: "
                                         f"got {got.flatten()[:8].tolist()} expected "
                                         f"{expected.flatten()[:8].tolist()}")
            self._tally(True)
        except AssertionError as e:
            self._tally(False, f"{case}: {e}")

    @staticmethod
    def _near(got, expected, rtol, atol):
        """torch.testing.assert_close's rule (torch.isclose, NaN never equal), without its first
        call's import of torch.distributed.tensor: 0.8 s of CPU in every rank of every job."""
        if got.is_complex():  # both parts
            got, expected = torch.view_as_real(got), torch.view_as_real(expected.to(got.dtype))
        got64, want64 = got.to(torch.float64), expected.to(torch.float64)
        near = torch.isclose(got64, want64, rtol=rtol, atol=atol)
        if not bool(near.all()):
            far = ~near
            i = int(far.flatten().nonzero()[0])
            raise AssertionError(
                f"{int(far.sum())} of {got.numel()} elements not close (rtol {rtol:.3g}, atol "
                f"{atol:.3g}), e.g. element {i}: got {got64.flatten()[i].item()!r} expected "
                f"{want64.flatten()[i].item()!r}")

    @staticmethod
    def _within(got, expected, bound):
        got64, want64 = got.to(torch.float64), expected.to(torch.float64)
        err = (got64 - want64).abs()
        bad = ~(err <= bound.to(torch.float64)) & ~(got64.isnan() & want64.isnan())
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            raise AssertionError(
                f"{int(bad.sum())} of {got.numel()} elements outside the bound, e.g. element {i}: "
                f"got {got64.flatten()[i].item()!r} expected {want64.flatten()[i].item()!r}, "
                f"error {err.flatten()[i].item():.3g} > bound {bound.flatten()[i].item():.3g}")

    def true(self, case, cond, detail=""):
        if cond:
            self._tally(True)
        else:
            self._tally(False, f"{case}: {detail}")

    def skip(self, case, reason):
        """`case` does not apply here (on this rank, at this world size), for `reason`: reported as
        a skip, neither passed nor failed. Never for a check that could run: the skip says why
        it cannot."""
        self.behaviours.setdefault(self.current, [0, 0])
        self.skipped.setdefault(self.current, []).append(f"{case}: {reason}")

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
        self.compare_deferred()
        world = dist.get_world_size() if dist.is_initialized() else self.world
        ran = os.environ.get("MPIGPU_EXPECT_RAN")  # a forced algorithm must not have fallen back
        if ran:
            import torch_mpi_gpu
            runs = torch_mpi_gpu._C.algorithm_runs()
            self.section("the expected algorithm ran")
            self.true(f"{ran} ran", runs.get(ran, 0) > 0, str(runs))
        for f in self.failures[:50]:
            print(f"[rank {self.rank}] FAIL {self.name}: {f}", flush=True)
        if self.failures:
            print(f"[rank {self.rank}] replay with MPIGPU_TEST_SEED_OFFSET={SEED_OFFSET}", flush=True)
        # the skipped checks, as the failed ones: read by tests/conftest.py (passed_counts)
        skipped = [f"[{behaviour}] {case}" for behaviour, cases in self.skipped.items()
                   for case in cases]
        for s in skipped[:50]:
            print(f"[rank {self.rank}] SKIP {self.name}: {s}", flush=True)
        # one line per behaviour, read by tests/conftest.py (passed_counts); its skipped checks,
        # where it has any, after the failed ones
        # (a section that made no check is left out: the driver then reports it as not run)
        for behaviour, (passed, failed) in self.behaviours.items():
            skips = len(self.skipped.get(behaviour, ()))
            if passed + failed + skips == 0:
                continue
            print(f'[rank {self.rank}/{world}] behaviour "{behaviour}": {passed} passed, '
                  f'{failed} failed' + (f", {skips} skipped" if skips else ""), flush=True)
        self._clock()
        if self.rank == 0:  # read by tests/conftest.py (run_mpi) into MPIGPU_TEST_TIMINGS
            spent = "; ".join(f"{name} {s:.1f}" for name, s in self.seconds.items() if s >= 0.05)
            print(f"[rank 0/{world}] seconds by section: {spent}", flush=True)
        print(f"[rank {self.rank}/{world}] {self.name}: {self.passed} checks passed, "
              f"{len(self.failures)} failed" + (f", {len(skipped)} skipped" if skipped else ""),
              flush=True)
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
    if code:
        os._exit(code)
    if not quick_exit_allowed():
        sys.exit(0)
    exit_without_teardown()


def quick_exit_allowed():
    """Ranks other than 0 of a launch by Open MPI's mpirun (every test leg but MPICH's and
    srun's), unless MPIGPU_TEST_FULL_EXIT=1. Under MPICH's Hydra an os._exit after MPI_Finalize
    got the rank still exiting killed (3 launches of 10): MPICH 5 sends Hydra its PMI "finalize"
    only from its C exit handlers, which os._exit skips, so Hydra takes the exit for a crash and
    kills the ranks still running (seen with strace, 2026-12-02; docs/troubleshooting.md). C's
    exit() instead ran libtorch_python's thread-local destructors in a live interpreter (FSDP
    runs aborted): those launchers keep the whole exit."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "")
    return (rank.isdigit() and rank != "0" and "SLURM_JOB_ID" not in os.environ
            and os.environ.get("MPIGPU_TEST_FULL_EXIT") != "1")


def exit_without_teardown():
    """Ends a passing run as the interpreter would (threads joined, then every exit handler: ours
    drains and finalises MPI, mpi4py's, torch's), less the interpreter's teardown and the static
    destructors: 0.5-0.8 s of CPU per process on the 2-core VM (a fifth to a quarter of a small
    launch), paid by every rank of every launch. Rank 0 of each launch still exits in full (a
    crash in teardown fails the run there), as do the exit tests (exits.py, shutdown.py), every
    rank under MPIGPU_TEST_FULL_EXIT=1 (the GPU runs: each rank's CUDA state goes then), and the
    launchers quick_exit_allowed() names."""
    import atexit
    import ctypes
    import threading

    threading._shutdown()  # the interpreter's first step at exit: non-daemon threads joined
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")  # where mpi4py started MPI, it finalises it only at the
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():  # very end (Py_AtExit)
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C stdio (MPI's and torch's own lines), which os._exit drops
    os._exit(0)
