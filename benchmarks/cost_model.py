"""A cost model of all_reduce (#22 item 7): today's host-driven ring against the node-aware paths,
from measured components, checked against every configuration that runs here, then predicted for
one node of 8 GPUs and 2-4 such nodes, beside NCCL's figures.

    python benchmarks/cost_model.py [--out [FILE | DIR/]]   # --out alone: a new run folder

Each parameter says where its number comes from: "measured" (on this project's machines, the
file named), "spec" (the hardware's data sheet) or "reference" (a published figure). The model is
deliberately simple: a time per hand-off or barrier plus bytes over the narrowest bandwidth each
step uses, steps in sequence. What it predicts for hardware we have not run on is a prediction,
not a measurement."""

import argparse
from dataclasses import dataclass
from pathlib import Path

KIB, MIB = 1 << 10, 1 << 20


@dataclass
class Param:
    value: float
    source: str


P = {
    # the CI-class VM, 2 cores (per-phase timers; benchmarks/results/
    # 2026-11-27_cpu-2core_node-reductions/)
    "cpu_fixed_s": Param(4.5e-6, "measured: an 8 B all_reduce through torch + mpigpu, 4.6-4.8 us"),
    "cpu_copy_Bps": Param(1 * MIB / 25e-6, "measured: copying 1 MiB into the segment, 24-38 us"),
    "cpu_copy_dram_Bps": Param(1 * MIB / 50e-6, "measured: the same, pieces of a 16 MiB op, 46-60 us"),
    "cpu_reduce_Bps": Param(0.5 * MIB / 13.5e-6, "measured: reducing a 512 KiB slice of 2 slots, 12-15 us"),
    "cpu_barrier_s": Param(1e-6, "measured: a shared-memory barrier with the peer running, 0.1-1 us"),
    "hosts_link_Bps": Param(10e9 / 8, "spec: the simulated hosts' link, tc tbf 10 Gbit/s each way"),
    # the lent H200 shared by 2 ranks (issue #22, scripts/gpu_check.sh runs; from the next lease
    # benchmarks/shared_gpu_handoff.py measures the hand-off, and a stray event's cost, directly)
    "shared_handoff_s": Param(150e-6, "measured: kernel in A, sync, host flag, kernel in B, one GPU time-sliced"),
    # the node algorithm in CUDA IPC slots on that GPU, 2026-12-04 (benchmarks/results/
    # 2026-12-04_h200_gpu-check-node-ipc/):
    # one-shot ops (4 switches) took 564-579 us from 16 B to 64 KiB, two-shot (6) 866-867 us
    # from 256 KiB to 4 MiB, where the bytes are a few microseconds
    "shared_switch_s": Param(143e-6, "measured: one switch between the ranks' time slices, from "
                                     "the node algorithm's small ops (566 us / 4, 866 us / 6)"),
    "shared_mem_Bps": Param(2.1e12, "measured: bytes read + written per second over a whole "
                                    "op, from its 16 MiB two-shot (929 us: 858 switching, 9 x 16 MiB)"),
    "shared_mem_large_Bps": Param(3.3e12, "measured: the same from its 256 MiB two-shot (1591 us: "
                                          "733 us for 9 x 256 MiB; large copies run faster)"),
    # the leader form there, 2026-12-04 (benchmarks/results/2026-12-04_h200_gpu-check-node-leader/):
    # 382-505 us from 16 B to 256 KiB
    "shared_leader_fixed_s": Param(452e-6, "measured: the leader form's median op from 16 B to 256 KiB "
                                           "(2 designed switches took ~3.2 switch times; the likely third: the "
                                           "leader's stream events, queued while its peer's copies ran)"),
    "gpu_copy_Bps": Param(16 * MIB / 20e-6, "measured: the H200 copies 16 MiB in ~20 us"),
    "today_ring_handoffs_16m": Param(6.5, "measured: today's ring at 16 MiB, 2 ranks: 6-7 hand-offs"),
    # a real node: 8 GPUs, each its own, NVSwitch; and nodes joined by one 400 Gb/s NIC per GPU
    "kernel_sync_s": Param(14e-6, "measured: one process's kernel + synchronize, 13-15 us (H200)"),
    "host_flag_s": Param(0.5e-6, "measured: a flag round trip through host memory, 0.5 us"),
    "device_barrier_s": Param(3e-6, "reference: vLLM's one-shot custom all-reduce, 6 us at 512 B on 8xH100"),
    "nvlink_Bps": Param(450e9, "spec: NVLink 4, 900 GB/s per GPU both ways (450 each way)"),
    "net_Bps": Param(50e9, "spec: a 400 Gb/s NIC per GPU (InfiniBand NDR)"),
    "net_alpha_s": Param(3e-6, "reference: an MPI message over InfiniBand with GPUDirect RDMA, 2-3 us"),
    "host_step_s": Param(25e-6, "model: one host-driven ring step on separate GPUs: a stream sync, "
                                "a kernel launch, MPI's handshake"),
}


def v(name):
    return P[name].value


# ---------------------------------------------------------------------------------------------
# Algorithms

def ring_host_driven(n, p, step_s, link_Bps, reduce_Bps):
    """Today's GPU path: 2(p-1) steps of n/p, each a host round trip, the reduce on the device."""
    if p == 1:
        return 0.0
    return 2 * (p - 1) * (step_s + n / p / link_Bps) + (p - 1) * n / p / reduce_Bps


def node_two_shot(n, L, barrier_s, copy_Bps, peer_Bps, reduce_Bps):
    """Copy in the peers' slices, barrier, reduce this rank's 1/L reading every peer, barrier,
    copy every slice out."""
    return (barrier_s * 2 + (L - 1) / L * n / copy_Bps
            + (L - 1) / L * n / peer_Bps + n / L / reduce_Bps
            + (L - 1) / L * n / peer_Bps)


def node_one_shot(n, L, barrier_s, copy_Bps, peer_Bps, reduce_Bps):
    """Copy in, one barrier, every rank reads every peer's whole input and reduces it."""
    return barrier_s + n / copy_Bps + (L - 1) * n / peer_Bps + (L - 1) * n / reduce_Bps


def cross_ring(m, N, alpha_s, net_Bps):
    """All-reduce of m bytes among N nodes (one rank per node per local index, in parallel):
    a ring of 2(N-1) steps of m/N."""
    return 0.0 if N == 1 else 2 * (N - 1) * (alpha_s + m / N / net_Bps)


def hierarchical(n, L, N, node_step, cross):
    """Reduce-scatter inside the node, each slice all-reduced across nodes, all-gather inside."""
    return node_step(n, L) + cross(n / L, N)


# ---------------------------------------------------------------------------------------------
# Checks: the configurations that run here

def checks():
    rows = []
    cpu_node = lambda n, L, copy: v("cpu_fixed_s") + node_two_shot(  # noqa: E731
        n, L, v("cpu_barrier_s"), copy, copy, v("cpu_reduce_Bps"))
    rows.append(("CPU, 1 host x 2 ranks, node two-shot, 1 MiB", cpu_node(MIB, 2, v("cpu_copy_Bps")),
                 74.3e-6, "2026-11-27_cpu-2core_node-reductions"))
    rows.append(("CPU, 1 host x 2 ranks, node two-shot, 16 MiB",
                 cpu_node(16 * MIB, 2, v("cpu_copy_dram_Bps")), 1609e-6, "2026-11-27_cpu-2core_node-reductions"))
    # across the simulated hosts the link carries 2 pairs x the slice each way
    n = 16 * MIB
    link_time = 2 * (n / 2) / v("hosts_link_Bps")
    rows.append(("CPU, 2 hosts x 2 ranks, hierarchical, 16 MiB",
                 cpu_node(n, 2, v("cpu_copy_dram_Bps")) + link_time, 15.0e-3,
                 "2026-11-27_two-hosts-netns_node-allreduce-x2"))
    # one shared GPU: every cross-process hand-off costs a time slice
    rows.append(("1 shared H200 x 2 ranks, today's ring, 16 MiB",
                 v("today_ring_handoffs_16m") * v("shared_handoff_s") + 3 * 16 * MIB / v("gpu_copy_Bps"),
                 1.01e-3, "issue #22 (gpu_check.sh)"))
    return rows


# One GPU shared by the ranks (the lent machine): their kernels never overlap, and each time the
# GPU turns from one process's work to another's it waits out a time slice. An op costs its
# switches plus its bytes (read + written, every rank's added: they run one after another).
# all_reduce of n bytes, L ranks, in CUDA IPC slots ordered from the host:
#   one-shot: all copy in, all reduce every slot: 2L switches, traffic (L + 1 + L) n per rank;
#   two-shot: copy in, reduce 1/L, copy out: 3L switches, about 9n at L = 2;
#   leader (NODE_LEADER=1): peers copy in, the first rank reduces into its slot and its output
#   in one pass, peers copy out: 2 switches (peers -> leader -> peers; a peer's copy out and its
#   next copy in run back to back), 8n at L = 2 (copy in 2n, reduce 2n read + 2n written, copy
#   out 2n).

def shared_gpu(n, switches, traffic, mem_Bps=None):
    return switches * v("shared_switch_s") + traffic * n / (mem_Bps or v("shared_mem_Bps"))


def shared_gpu_checks():
    """(configuration, predicted, measured, source) on the lent H200, 2 ranks, 2026-12-04."""
    src = "2026-12-04_h200_gpu-check-node-ipc"
    return [("1 shared H200 x 2 ranks, node IPC one-shot, 64 KiB", shared_gpu(64 * KIB, 4, 5), 566.2e-6, src),
            ("1 shared H200 x 2 ranks, node IPC two-shot, 4 MiB", shared_gpu(4 * MIB, 6, 9), 866.8e-6, src),
            ("1 shared H200 x 2 ranks, node IPC two-shot, 16 MiB", shared_gpu(16 * MIB, 6, 9), 929.4e-6, src),
            ("1 shared H200 x 2 ranks, node IPC two-shot, 64 MiB", shared_gpu(64 * MIB, 6, 9), 1044.0e-6, src),
            ("1 shared H200 x 2 ranks, node IPC two-shot, 256 MiB", shared_gpu(256 * MIB, 6, 9), 1591.4e-6, src)]


def shared_gpu_leader(n, traffic=8, mem_Bps=None):
    """The leader form on the shared GPU: its measured fixed cost plus its bytes."""
    return v("shared_leader_fixed_s") + traffic * n / (mem_Bps or v("shared_mem_Bps"))


def shared_gpu_leader_checks():
    """The leader form (2 designed switches, 8n bytes at 2 ranks) against its 2026-12-04 run."""
    src = "2026-12-04_h200_gpu-check-node-leader"
    measured = ((MIB, 383.4e-6), (4 * MIB, 473.7e-6), (16 * MIB, 522.7e-6), (64 * MIB, 665.2e-6),
                (256 * MIB, 1019.6e-6))
    rows = [(f"1 shared H200 x 2 ranks, node IPC leader, {fmt_b(n)}", shared_gpu_leader(n), t, src)
            for n, t in measured]
    rows.append(("  the same, bytes at the 256 MiB op's rate",
                 shared_gpu_leader(256 * MIB, mem_Bps=v("shared_mem_large_Bps")), 1019.6e-6, src))
    return rows


def shared_gpu_predictions():
    """#22's targets on the lent GPU, 2 ranks. The leader form at its 2 designed switches: what it
    should take now that an op queues no stream event where the stream has no work left (the
    leader's events were queued while its peer's copies ran: the likely third switch; not run)."""
    rows = []
    for n, target in ((16 * MIB, "<= 0.45 ms"), (256 * MIB, "<= 1.0 ms")):
        large = v("shared_mem_large_Bps") if n > 16 * MIB else None
        rows.append((f"leader form, 2 switches (no idle-stream events; not run), {fmt_b(n)}",
                     shared_gpu(n, 2, 8, large), target))
    return rows


def predictions():
    """(config, size, today's ring, node-aware host-ordered, node-aware device-ordered, NCCL)."""
    out = []
    nccl = {(1, 16 * MIB): ("~120 us", "reference: 242 GB/s busbw, 8xH200 (issue #22)")}
    for N in (1, 2, 4):
        L = 8
        p = N * L
        for n in (64 * KIB, MIB, 16 * MIB, 256 * MIB):
            today = ring_host_driven(n, p, v("host_step_s") + (v("net_alpha_s") if N > 1 else 0),
                                     v("net_Bps") if N > 1 else v("nvlink_Bps"), v("gpu_copy_Bps"))
            host_barrier = v("kernel_sync_s") + v("host_flag_s")

            def node(m, Lr, barrier):
                step = node_one_shot if m <= 256 * KIB else node_two_shot
                return step(m, Lr, barrier, v("gpu_copy_Bps"), v("nvlink_Bps"), v("gpu_copy_Bps"))

            cross = lambda m, Nn: cross_ring(m, Nn, v("net_alpha_s"), v("net_Bps"))  # noqa: E731
            host = hierarchical(n, L, N, lambda m, Lr: node(m, Lr, host_barrier), cross)
            dev = hierarchical(n, L, N, lambda m, Lr: node(m, Lr, v("device_barrier_s")), cross)
            ref = nccl.get((N, n), ("", ""))[0]
            if N > 1 and n == 256 * MIB:
                ref = f"~{n * 2 * (p - 1) / p / 425e9 * 1e6:.0f} us"  # 400-450 GB/s busbw
            out.append((f"{N} node{'s' if N > 1 else ''} x 8 GPUs", n, today, host, dev, ref))
    return out


def fmt_s(t):
    return f"{t * 1e6:.0f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def fmt_b(n):
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def report():
    lines = ["# all_reduce cost model (benchmarks/cost_model.py): measured components, predicted times", ""]
    lines.append("## Checks against what runs here (predicted / measured)")
    lines.append(f"{'configuration':52} {'predicted':>10} {'measured':>10} {'ratio':>6}  source")
    for name, pred, meas, src in checks() + shared_gpu_checks() + shared_gpu_leader_checks():
        lines.append(f"{name:52} {fmt_s(pred):>10} {fmt_s(meas):>10} {pred / meas:6.2f}  {src}")
    lines += ["", "## Predictions for the lent GPU against #22's targets (2 ranks)"]
    for name, pred, target in shared_gpu_predictions():
        lines.append(f"{name:52} {fmt_s(pred):>10}   target {target}")
    lines += ["", "## Predictions, fp32 (nothing here was measured on such a machine)",
              f"{'configuration':18} {'size':>8} {'today ring':>11} {'node, host':>11} "
              f"{'node, device':>12} {'NCCL':>10}"]
    for cfg, n, today, host, dev, ref in predictions():
        lines.append(f"{cfg:18} {fmt_b(n):>8} {fmt_s(today):>11} {fmt_s(host):>11} "
                     f"{fmt_s(dev):>12} {ref:>10}")
    lines += ["", "today ring: our host-driven ring over all ranks (each step a stream sync and a "
              "kernel launch); node, host: the node-aware path ordered from the host (an event "
              "sync and a host flag per barrier: what ranks sharing one GPU need); node, device: "
              "the same with device-side flags (a kernel waits on its peers). Across nodes both "
              "are hierarchical (reduce-scatter in the node, a ring per local index over the "
              "network, all-gather in the node). NCCL at 2-4 nodes and 256 MiB: 400-450 GB/s "
              "busbw for H100/H200 with NVLink and NDR InfiniBand (a vendor's cluster validation "
              "guide, saturncloud.io/blog/crusoe-nccl-cluster-validation).", "",
              "## Parameters"]
    for name, p in P.items():
        lines.append(f"{name:24} {p.value:12.4g}  {p.source}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", nargs="?", const="", help="also write the report to this file, into "
                    "this folder (DIR/) or, without a value, into a new run folder in benchmarks/results")
    args = ap.parse_args()
    text = report()
    print(text, end="")
    if args.out is not None and (args.out == "" or args.out.endswith("/") or Path(args.out).is_dir()):
        manifest = helper()  # a run folder: the report and what made it
        folder, out = manifest.run_paths(args.out, "cost-model", "cost_model", prefix=False,
                                         machine="model")
        Path(f"{out}.txt").write_text(text)
        manifest.write_manifest(folder, "all_reduce cost model: checks against the runs here, "
                                "predictions for 8-GPU nodes beside NCCL", "2-32 (modelled)",
                                devices="modelled: one H200 shared by 2 ranks; nodes of 8 H100/H200",
                                kind="predicted", mpi="n/a", torch="n/a",
                                machine="none: a prediction from measured components and data sheets")
    elif args.out:
        Path(args.out).write_text(text)


def helper():
    """torch_mpi_gpu/manifest.py by its path: this model runs without the built extension."""
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "torch_mpi_gpu" / "manifest.py"
    spec = importlib.util.spec_from_file_location("mpigpu_manifest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
