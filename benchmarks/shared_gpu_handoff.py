"""Two processes on one GPU, taking turns as the node algorithm's ranks do where they share it
(#22): what one switch between their time slices costs, and whether a command one process
queues while the other's work runs (a stream event with no work before it, as the CUDA paths
recorded in every op until 2026-12-05: TORCH_MPIGPU_CUDA_ORDER_EVENTS) costs the other a switch.
The cost model's `shared_switch_s` (benchmarks/cost_model.py) and the leader form's third switch
(docs/performance.md) come from these two numbers. No MPI, no mpigpu: two torch processes and
a few words of host shared memory.

    python benchmarks/shared_gpu_handoff.py [--rounds 200] [--work-us 50] [--device cuda|cpu]

Process A times its own work, a kernel (torch.cuda._sleep of WORK_US x 1000 cycles: 25-50 us at
1-2 GHz) then a synchronize, in four phases of ROUNDS rounds (medians, microseconds):
  alone        B does nothing on the device; it only answers A's flag (the host round trip)
  stray event  as alone, but B records an event on its own idle stream while A's kernel runs
  stray copy   as alone, but B queues a 1 MiB device-to-device copy meanwhile (copy engines
               may serve another process's copies beside a kernel: peers' copies in and out
               beside the leader's kernel, if so)
  hand-off     A and B in turn, each its kernel + synchronize, a flag passing the turn: the
               round trip, less two turns alone, halved: one switch each way

`--device cpu` runs the same protocol with host work (no time slices: it checks the harness; the
tests run it so)."""

import argparse
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

# the words both processes see: [phase, request, answer, ready]
PHASE, REQUEST, ANSWER, READY = range(4)
ALONE, STRAY, STRAY_COPY, HANDOFF, DONE = 1, 2, 3, 4, 5


def wait_for(flags, index, value):
    while flags[index] != value:
        pass


def device_work(device, work_us):
    """A kernel of about work_us that the host does not wait for (on a GPU), or host work."""
    if device.type == "cuda":
        torch.cuda._sleep(int(work_us * 1000))  # cycles: ~1 ns each at the GPU's ~1-2 GHz
    else:
        end = time.perf_counter() + work_us * 1e-6
        while time.perf_counter() < end:
            pass


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def a_round(flags, i, device, work_us):
    """A's side of a round of `alone` or `stray event`: its kernel, B's answer while the kernel
    runs, its synchronize; A's time from launch to the synchronize's return."""
    start = time.perf_counter()
    device_work(device, work_us)
    flags[REQUEST] = i
    wait_for(flags, ANSWER, i)
    synchronize(device)
    return time.perf_counter() - start


def process_a(flags, device, rounds, work_us, out):
    times = {}
    for phase in (ALONE, STRAY, STRAY_COPY):
        flags[PHASE] = phase
        wait_for(flags, READY, phase)
        samples = [a_round(flags, phase * 1_000_000 + i, device, work_us) for i in range(rounds)]
        times[phase] = statistics.median(samples[rounds // 10:])  # (the first rounds warm up)
    flags[PHASE] = HANDOFF
    wait_for(flags, READY, HANDOFF)
    samples = []
    for i in range(rounds):
        start = time.perf_counter()
        device_work(device, work_us)
        synchronize(device)
        flags[REQUEST] = HANDOFF * 1_000_000 + i  # B's turn
        wait_for(flags, ANSWER, HANDOFF * 1_000_000 + i)
        samples.append(time.perf_counter() - start)
    times[HANDOFF] = statistics.median(samples[rounds // 10:])
    flags[PHASE] = DONE
    out.extend([times[ALONE], times[STRAY], times[STRAY_COPY], times[HANDOFF]])


def process_b(flags, device, work_us):
    """B answers A's requests: at once (alone), after recording an event on its own idle stream
    (stray event), or after its own kernel + synchronize (hand-off)."""
    event_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    src = torch.ones(1 << 18, device=device)  # 1 MiB
    dst = torch.empty_like(src)
    synchronize(device)
    seen = 0
    while True:
        phase = flags[PHASE]
        if phase == DONE:
            return
        if phase != seen:
            seen = phase
            flags[READY] = phase
            continue
        request = flags[REQUEST]
        if request == flags[ANSWER] or request // 1_000_000 != phase:
            continue
        if phase == STRAY and event_stream is not None:
            torch.cuda.Event().record(event_stream)  # a command with no work before it
        if phase == STRAY_COPY and event_stream is not None:
            with torch.cuda.stream(event_stream):
                dst.copy_(src, non_blocking=True)
        if phase == HANDOFF:
            device_work(device, work_us)
            synchronize(device)
        flags[ANSWER] = request


def child(role, flags, device_name, rounds, work_us, results):
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # the context, before any timing
        torch.cuda.synchronize()
    if role == "a":
        out = []
        process_a(flags, device, rounds, work_us, out)
        results[:] = out
    else:
        process_b(flags, device, work_us)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--work-us", type=float, default=50.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device visible")
    ctx = mp.get_context("spawn")
    flags = ctx.Array("q", 4, lock=False)
    results = ctx.Array("d", 4, lock=False)
    # daemons: if A fails, B (which spins on the flags) must not outlive this process
    a, b = (ctx.Process(target=child, args=(role, flags, args.device, args.rounds, args.work_us,
                                            results), daemon=True) for role in ("a", "b"))
    a.start()
    b.start()
    a.join(timeout=600)
    flags[PHASE] = DONE  # (B's way out, whatever became of A)
    b.join(timeout=30)
    if a.exitcode != 0 or b.exitcode != 0:
        sys.exit(f"the timing process exited with {a.exitcode}, the other with {b.exitcode}")
    alone, stray, copy, handoff = (t * 1e6 for t in results)
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "host (harness check)"
    print(f"# {name}: 2 processes, {args.rounds} rounds each phase, work {args.work_us:.0f} us, medians")
    print(f"{'phase':<14}{'us':>10}  reading")
    print(f"{'alone':<14}{alone:>10.1f}  A's kernel + synchronize, B answering from the host")
    print(f"{'stray event':<14}{stray:>10.1f}  the same, B recording an event meanwhile: "
          f"{stray / alone:.2f}x alone, {stray - alone:+.1f} us")
    print(f"{'stray copy':<14}{copy:>10.1f}  the same, B copying 1 MiB meanwhile: "
          f"{copy / alone:.2f}x alone, {copy - alone:+.1f} us")
    print(f"{'hand-off':<14}{handoff:>10.1f}  A's turn and B's: one switch each way = "
          f"{max(handoff - 2 * alone, 0) / 2:.1f} us each beyond the two turns alone")


if __name__ == "__main__":
    main()
