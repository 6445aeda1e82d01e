"""The seed training study: MNIST-sized MLP (~235k parameters), CNN (~415k) and LSTM (~82k),
trained sequentially (1 and N threads) and with DDP over mpigpu and gloo (and nccl on a GPU) at
1, 2 and 4 ranks; epoch time, images/s, speed-up, parallel efficiency, the share of the step spent
in (exposed) communication, and final accuracy.

    python benchmarks/train_study.py --out          # orchestrates; files in a new run folder
    python benchmarks/train_study.py --models mlp --ranks 2 --backends mpigpu       # a subset
    python benchmarks/train_study.py --backends "mpigpu,mpigpu[NODE_BUFFER_BYTES=0],gloo"
                                     # mpigpu[...]: with those TORCH_MPIGPU_* settings
    scripts/two_hosts.sh up names 10gbit                     # across two simulated hosts:
    MPIGPU_RUN_MACHINE=two-hosts-netns python benchmarks/train_study.py --ranks 2 \
        --launcher "scripts/two_hosts.sh mpirun" --setup "2 hosts (netns, veth, tbf 10gbit) x 1 rank" --out

--out alone writes train_cpu.txt, .json, .png and MANIFEST.json into a new run folder,
benchmarks/results/<date>_<machine>_train-study/ (torch_mpi_gpu/manifest.py); --out DIR/ into
DIR; --out PREFIX (no folder of that name) PREFIX.txt, .json, .png as before, no manifest.

Data ships with scikit-learn: the 1797 8x8 digits scaled to 28x28 (MNIST's shape), 1437 for
training (tiled with a little noise to --samples images per epoch, default 12800) and 360 held
out for accuracy. Batch 128 per rank, SGD with momentum, 5 epochs.

Threads: every rank of a distributed run gets one intra-op thread (torch.set_num_threads(1),
OMP_NUM_THREADS=1) and mpirun's default placement (one core per rank while ranks <= cores,
unbound when oversubscribed); the sequential runs get 1 and --threads threads.
Exposed communication: after the timed epochs, one more epoch runs under DDP's no_sync() (no
gradient all-reduce); share = 1 - (that epoch's time / the mean timed epoch).
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve()


def build(model):
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    if model == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 768),
                             nn.ReLU(), nn.Linear(768, 10))
    if model == "rnn":
        return LSTMClassifier()
    raise ValueError(model)


class LSTMClassifier(nn.Module):
    """Reads the image row by row (28 steps of 28 pixels)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(28, 128, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        out, _ = self.lstm(x.view(x.shape[0], 28, 28))
        return self.head(out[:, -1])


def digits(samples, seed=0):
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    test, train = perm[:360], perm[360:]
    g = torch.Generator().manual_seed(seed + 1)
    reps = -(-samples // len(train))
    xt = x[train].repeat(reps, 1, 1, 1)[:samples]
    xt = xt + 0.05 * torch.randn(xt.shape, generator=g)
    yt = y[train].repeat(reps)[:samples]
    return (xt, yt), (x[test], y[test])


# ------------------------------------------------------------------------------------------
# worker: one run (sequential, or one rank of a distributed job)

def worker(args):
    torch.set_num_threads(args.threads)
    dist_run = args.backend != "none"
    rank, world = 0, 1
    device = torch.device(args.device)
    if dist_run:
        import torch.distributed as dist
        import torch_mpi_gpu
        from torch.nn.parallel import DistributedDataParallel as DDP
        if args.device == "cuda":
            torch_mpi_gpu.select_cuda_device()
            device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(args.backend)
        rank, world = dist.get_rank(), dist.get_world_size()
    (x, y), (xt, yt) = digits(args.samples)
    x, y = x[rank::world].to(device), y[rank::world].to(device)
    torch.manual_seed(0)
    net = build(args.model).to(device)
    params = sum(p.numel() for p in net.parameters())
    model = DDP(net) if dist_run else net
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = len(x) // args.batch
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def epoch(e, no_sync=False):
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(e)).to(device)
        if dist_run:
            dist.barrier()
        t0 = time.perf_counter()
        last = 0.0
        for s in range(steps):
            idx = perm[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            if no_sync:
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()
            opt.step()
            last = loss
        sync()
        if dist_run:
            dist.barrier()
        return time.perf_counter() - t0, float(last)

    times, losses = [], []
    for e in range(args.epochs):
        t, l = epoch(e)
        times.append(t)
        losses.append(l)
    with torch.no_grad():
        acc = (net(xt.to(device)).argmax(1).cpu() == yt).float().mean().item()
    compute_only = epoch(args.epochs, no_sync=True)[0] if dist_run and world > 1 else None
    if rank == 0:
        print("RESULT " + json.dumps({
            "model": args.model, "params": params, "backend": args.backend, "ranks": world,
            "threads": args.threads, "device": args.device, "steps_per_epoch": steps,
            "images_per_epoch": steps * args.batch * world, "epoch_times": times,
            "losses": losses, "accuracy": acc, "compute_only_epoch": compute_only}), flush=True)
    if dist_run:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------
# orchestrator

def launch(model, backend, ranks, threads, args):
    # mpigpu[NODE_BUFFER_BYTES=0] : mpigpu with those settings (torch_mpi_gpu.bench's syntax)
    from torch_mpi_gpu.bench import mpigpu_variant
    settings = mpigpu_variant(backend) or {}
    cmd = [sys.executable, str(HERE), "--worker", "--model", model,
           "--backend", "mpigpu" if settings else backend,
           "--threads", str(threads), "--epochs", str(args.epochs), "--samples", str(args.samples),
           "--batch", str(args.batch), "--device", args.device]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_opal_warn_on_missing_libcuda="0",
               **settings)
    if backend != "none":
        exported = ["OMP_NUM_THREADS", *settings]
        if args.launcher:  # takes Open MPI's mpirun arguments
            cmd = (shlex.split(args.launcher) + ["-np", str(ranks)]
                   + [a for k in exported for a in ("-x", k)] + cmd)
        else:
            from torch_mpi_gpu.mpirun import launch_command, mpirun_path
            cmd = launch_command(mpirun_path(), ranks, {k: env[k] for k in exported}) + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[7:]), "backend": backend}
    return {"model": model, "backend": backend, "ranks": ranks, "threads": threads,
            "error": (p.stdout + p.stderr)[-1500:]}


def summarize(runs):
    base = {r["model"]: r for r in runs if r.get("backend") == "none" and r.get("threads") == 1
            and "error" not in r}
    for r in runs:
        if "error" in r:
            continue
        timed = r["epoch_times"][1:] or r["epoch_times"]  # the first epoch warms up
        r["epoch_time"] = statistics.mean(timed)
        r["images_per_s"] = r["images_per_epoch"] / r["epoch_time"]
        b = base.get(r["model"])
        r["speedup"] = b and (r["images_per_s"] / (b["images_per_epoch"] / statistics.mean(
            b["epoch_times"][1:] or b["epoch_times"])))
        workers = r["ranks"] if r["backend"] != "none" else r["threads"]
        r["efficiency"] = r["speedup"] / workers if r["speedup"] else None
        c = r.get("compute_only_epoch")
        r["comm_share"] = max(0.0, 1 - c / r["epoch_time"]) if c else 0.0


def label(r):
    if r["backend"] == "none":
        return f"sequential, {r['threads']} thread{'s' if r['threads'] > 1 else ''}"
    return f"{r['backend']}, {r['ranks']} rank{'s' if r['ranks'] > 1 else ''}"


def table(runs):
    lines = [f"{'model':<5} {'run':<22} {'epoch s':>8} {'images/s':>10} {'speed-up':>9} "
             f"{'efficiency':>10} {'comm share':>10} {'accuracy':>9}"]
    for r in runs:
        if "error" in r:
            lines.append(f"{r['model']:<5} {label(r):<22} FAILED: {r['error'].splitlines()[-1][:80]}")
            continue
        sp = f"{r['speedup']:.2f}" if r["speedup"] else "-"
        ef = f"{r['efficiency']:.2f}" if r["efficiency"] else "-"
        lines.append(f"{r['model']:<5} {label(r):<22} {r['epoch_time']:>8.3f} {r['images_per_s']:>10.0f} "
                     f"{sp:>9} {ef:>10} {r['comm_share']:>10.0%} {r['accuracy']:>9.3f}")
    return "\n".join(lines)


def plot(runs, path, models, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in runs if "error" not in r]
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(4.5 * (len(models) + 1), 4))
    for ax, m in zip(axes, models):
        for backend in sorted({r["backend"] for r in ok if r["backend"] != "none"}):
            pts = sorted((r["ranks"], r["speedup"]) for r in ok
                         if r["model"] == m and r["backend"] == backend and r["speedup"])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=backend)
        seq = sorted((r["threads"], r["speedup"]) for r in ok
                     if r["model"] == m and r["backend"] == "none" and r["speedup"])
        ax.plot([p[0] for p in seq], [p[1] for p in seq], marker="s", ls="--", label="sequential (threads)")
        top = max([r["ranks"] for r in ok] + [2])
        ax.plot([1, top], [1, top], color="grey", lw=0.8, label="ideal")
        ax.set_title(f"{m}: speed-up vs 1 thread")
        ax.set_xlabel("ranks (or threads)")
        ax.set_ylabel("speed-up")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[-1]
    for r in ok:
        total = sum(r["epoch_times"])
        ax.scatter(total, r["accuracy"], s=18)
        ax.annotate(f"{r['model']} {label(r)}", (total, r["accuracy"]), fontsize=5)
    ax.set_xscale("log")
    ax.set_xlabel("training time, s (5 epochs)")
    ax.set_ylabel("test accuracy")
    ax.set_title("accuracy vs time")
    ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def orchestrate(args):
    models = args.models.split(",")
    ranks = [int(r) for r in args.ranks.split(",")]
    backends = [b for b in args.backends.split(",") if b]
    plan = []
    for m in models:
        plan.append((m, "none", 1, 1))
        if args.threads > 1:
            plan.append((m, "none", 1, args.threads))
        for b in backends:
            for n in ranks:
                plan.append((m, b, n, 1))
    try:
        from rich.progress import track
    except ImportError:
        track = lambda it, **_: it  # noqa: E731
    runs = [launch(m, b, n, t, args) for m, b, n, t in track(plan, description="training runs")]
    summarize(runs)
    import torch_mpi_gpu
    from torch_mpi_gpu.bench import cpu_model
    head = {"machine": f"{platform.node()}: {cpu_model()}, {os.cpu_count()} cores",
            "torch": torch.__version__, "mpi": torch_mpi_gpu.info()["mpi_library"].split(",")[0],
            "device": args.device, "epochs": args.epochs, "batch_per_rank": args.batch,
            "images_per_epoch": args.samples,
            "threads": "1 intra-op thread per rank (OMP_NUM_THREADS=1); mpirun default placement"}
    if args.setup:
        head["setup"] = args.setup
    text = "# " + " | ".join(f"{k}: {v}" for k, v in head.items()) + "\n" + table(runs)
    print(text)
    if args.out is not None:
        from torch_mpi_gpu.manifest import run_paths, write_manifest
        folder, out = run_paths(args.out, "train-study", f"train_{args.device}", args.device)
        if folder:  # (only_if_missing: the scorecard's run folder has its own)
            write_manifest(folder, f"train_study.py: {args.models} trained sequentially and with DDP "
                           f"over {args.backends} at {args.ranks} ranks",
                           int(args.ranks) if args.ranks.isdigit() else args.ranks, device=args.device,
                           mpi=head["mpi"], only_if_missing=True,
                           notes=[head["setup"]] if args.setup else None)
        Path(f"{out}.txt").write_text(text + "\n")
        Path(f"{out}.json").write_text(json.dumps({"header": head, "runs": runs}, indent=1))
        plot(runs, f"{out}.png", models, f"{head['machine']}, torch {head['torch']}, {head['mpi']}")
    return 1 if any("error" in r for r in runs) else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,rnn")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--backends", default="mpigpu,gloo", help="add nccl with --device cuda")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads of the multi-threaded sequential run")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--samples", type=int, default=12800, help="training images per epoch")
    ap.add_argument("--batch", type=int, default=128, help="per rank")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out", nargs="?", const="", help="write OUT.txt, OUT.json and OUT.png (and "
                    "MANIFEST.json): without OUT into a new run folder in benchmarks/results")
    ap.add_argument("--launcher", help="command that takes Open MPI's mpirun arguments, e.g. "
                    "'scripts/two_hosts.sh mpirun' (default: the launcher of the MPI torch_mpi_gpu was "
                    "built against, as torch_mpi_gpu.mpirun picks it)")
    ap.add_argument("--setup", help="how the ranks are placed, for the results' header")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="none", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
