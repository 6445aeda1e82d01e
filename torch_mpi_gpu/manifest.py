"""Run folders for benchmark results: `<results>/<date>_<machine>_<what>/` holding a run's files and
its MANIFEST.json (what ran, the command, the commit, the machine, MPI, torch, ranks, devices,
measured or predicted; benchmarks/results/README.md).

    from torch_mpi_gpu.manifest import new_run, write_manifest
    run = new_run("allreduce-2ranks")                 # benchmarks/results/2026-12-06_cpu-2core_allreduce-2ranks/
    write_manifest(run, "all_reduce, 2 ranks", ranks=2)

    python -m torch_mpi_gpu.manifest new gpu-check --device cuda      # prints the folder it made
    python -m torch_mpi_gpu.manifest write DIR --what "..." --ranks 2 [--mpi ...] [--command ...]

Only the standard library at import: this file also runs by its path (scripts/gpu_check.sh before
the build, benchmarks/cost_model.py without one); torch and the extension are asked when there.
"""

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

KEYS = ("what", "command", "commit", "date", "machine", "mpi", "torch", "ranks", "devices", "kind")
# the folder's machine part where the slug from this machine's hardware would mislead (two
# simulated hosts on one VM: MPIGPU_RUN_MACHINE=two-hosts-netns)
MACHINE_ENV = "MPIGPU_RUN_MACHINE"


def default_results():
    """benchmarks/results of the checkout around the current folder, the script or this file,
    else ./results."""
    script = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] not in ("", "-c") else None
    for start in (Path.cwd(), script, Path(__file__).resolve().parent):
        if start is None:
            continue
        for folder in (start, *start.parents):
            if (folder / "benchmarks").is_dir() and (folder / "setup.py").exists():
                return folder / "benchmarks" / "results"
    return Path.cwd() / "results"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def gpus():
    """The names of the CUDA devices torch sees ([] without torch or CUDA)."""
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        return []


def gpu_slug(name):
    """NVIDIA H100 80GB HBM3 -> h100; NVIDIA A100-SXM4-80GB -> a100; GeForce RTX 4090 -> rtx4090."""
    words = [w for w in re.split(r"[\s_-]+", name) if w.lower() not in ("nvidia", "tesla", "geforce", "")]
    if len(words) > 1 and not re.search(r"\d", words[0]):
        words = [words[0] + words[1]]
    return re.sub(r"[^a-z0-9]", "", (words[0] if words else name).lower()) or "gpu"


def machine_slug(device="cpu"):
    """h100 / h200 (the GPU, for a CUDA run), else cpu-<n>core; MPIGPU_RUN_MACHINE overrides."""
    if os.environ.get(MACHINE_ENV):
        return os.environ[MACHINE_ENV]
    names = gpus() if device == "cuda" else []
    if names:
        return (f"{len(names)}x" if len(names) > 1 else "") + gpu_slug(names[0])
    return f"cpu-{os.cpu_count()}core"


def machine_text():
    names = gpus()
    gpu = f"{len(names)}x {names[0]}" if names else "no GPU"
    return f"{cpu_model()}, {os.cpu_count()} cores, {gpu}"


def git_commit(where=None):
    """HEAD of the checkout holding `where`, the script or the current folder, with a word where
    the tree has uncommitted changes; "unknown" without git (a copy of the tree, as on a lent
    machine)."""
    script = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] not in ("", "-c") else None
    for place in (where, script, Path.cwd()):
        if place is None or not Path(place).exists():
            continue
        try:
            sha = subprocess.run(["git", "-C", str(place), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True, timeout=20)
            if sha.returncode != 0:
                continue
            dirty = subprocess.run(["git", "-C", str(place), "status", "--porcelain",
                                    "--untracked-files=no"], capture_output=True, text=True,
                                   timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        return sha.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    return "unknown"


def mpi_version(in_job=False):
    """The first part of MPI_Get_library_version through torch_mpi_gpu._C.mpi_info(): in this
    process where it is a rank of a job (MPI is up), else in a short-lived child of its own (a
    launcher must not become an MPI singleton before it starts jobs). "unknown" where it fails."""
    code = ("import torch_mpi_gpu; "
            "print(torch_mpi_gpu._C.mpi_info()['library_version'].splitlines()[0].split(',')[0])")
    if in_job:
        try:
            import torch_mpi_gpu
            return torch_mpi_gpu._C.mpi_info()["library_version"].splitlines()[0].split(",")[0]
        except Exception:  # noqa: BLE001
            return "unknown"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_", "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix", "PMIX_",
                                "PMI_", "HYDRA_", "MPI_LOCAL"))}  # (not a rank of the caller's job)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:  # from / : in a source checkout's root `import torch_mpi_gpu` finds the sources
        out = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = out.stdout.strip().splitlines()
    return lines[-1].strip() if out.returncode == 0 and lines else "unknown"


def torch_version():
    try:
        import torch
        return torch.__version__
    except Exception:  # noqa: BLE001
        return "unknown"


def command_line(argv=None):
    """This process's command as typed, with the TORCH_MPIGPU_* settings in its environment."""
    argv = list(sys.argv if argv is None else argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and argv and argv[0].endswith(".py"):
        name = spec.name[:-len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        argv = ["-m", name] + argv[1:]
    elif argv and argv[0].endswith(".py"):
        try:  # relative to the checkout where it is inside one
            argv[0] = str(Path(argv[0]).resolve().relative_to(default_results().parents[1]))
        except ValueError:
            pass
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items()) if k.startswith("TORCH_MPIGPU_")]
    return " ".join(env + ["python"] + [shlex.quote(a) for a in argv])


def new_run(what, results=None, device="cpu", machine=None, date=None):
    """Makes and returns <results>/<date>_<machine>_<what>/ (-2, -3, ... where it exists)."""
    results = Path(results) if results else default_results()
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", what).strip("-") or "run"
    base = f"{date or datetime.date.today().isoformat()}_{machine or machine_slug(device)}_{slug}"
    folder, n = results / base, 1
    while True:
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            n += 1
            folder = results / f"{base}-{n}"


def write_manifest(folder, what, ranks, devices=None, kind="measured", command=None, device="cpu",
                   in_job=False, only_if_missing=False, mpi=None, commit=None, **extra):
    """Writes folder/MANIFEST.json (KEYS, then `extra`: notes=..., nccl=...); returns its path.
    devices: "cpu" or how the ranks share the GPU (default from `device`, `ranks` and the GPUs
    seen); in_job: called by a rank of the measured job (MPI asked in this process); mpi, commit:
    where the caller knows better (default: asked as above); only_if_missing: leave a manifest
    already there (a script run by another that wrote one)."""
    path = Path(folder) / "MANIFEST.json"
    if only_if_missing and path.exists():
        return path
    if devices is None:
        names = gpus() if device == "cuda" else []
        devices = "cpu" if not names else (
            f"{ranks} ranks sharing one {names[0]}" if len(names) == 1 else f"{ranks} ranks on {len(names)} GPUs")
    found = git_commit(folder)
    data = {"what": what, "command": command or command_line(),
            "commit": commit if commit and found == "unknown" else found,
            "date": datetime.date.today().isoformat(), "machine": machine_text(),
            "mpi": mpi or mpi_version(in_job), "torch": torch_version(), "ranks": ranks,
            "devices": devices, "kind": kind}
    data.update({k: v for k, v in extra.items() if v is not None})
    Path(folder).mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def run_paths(out, what, stem, device="cpu", prefix=True, machine=None):
    """Where a script writes. out "" (its --out given without a value): a new run folder for
    `what`; out an existing folder or ending with / (any out where prefix=False): that folder;
    else a file prefix, as before run folders. Returns (folder, prefix): the script writes
    prefix + ".json", ... (stem: the files' name in a folder) and its manifest into folder, which
    is None for a bare prefix (no manifest: its folder may hold other runs). machine: the folder
    name's machine part, where not this machine's (a prediction: "model")."""
    if out == "":
        folder = new_run(what, device=device, machine=machine)
    elif out.endswith(os.sep) or Path(out).is_dir() or not prefix:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
    else:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        return None, Path(out)
    return folder, folder / stem


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    new = sub.add_parser("new", help="make a new run folder and print its path")
    new.add_argument("what")
    new.add_argument("--results", help="default: benchmarks/results of this checkout")
    new.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    slug = sub.add_parser("slug", help="print this machine's part of a run folder's name")
    slug.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    w = sub.add_parser("write", help="write DIR/MANIFEST.json")
    w.add_argument("dir")
    w.add_argument("--what", required=True)
    w.add_argument("--ranks", required=True)
    w.add_argument("--devices")
    w.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    w.add_argument("--kind", choices=("measured", "predicted"), default="measured")
    w.add_argument("--command")
    w.add_argument("--commit", help="where the tree travels without .git (a lent machine)")
    w.add_argument("--mpi", help="default: torch_mpi_gpu._C.mpi_info() in a child process")
    args = ap.parse_args(argv)
    if args.verb == "new":
        print(new_run(args.what, args.results, args.device))
    elif args.verb == "slug":
        print(machine_slug(args.device))
    else:
        ranks = int(args.ranks) if args.ranks.isdigit() else args.ranks
        path = write_manifest(args.dir, args.what, ranks, args.devices, args.kind, args.command,
                              args.device, mpi=args.mpi, commit=args.commit)
        print(path)
    return 0


if __name__ == "__main__":
    # run by its path: the package's folder is first on sys.path; its modules are not top-level ones
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    sys.exit(main())
