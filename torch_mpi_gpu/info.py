"""`python -m torch_mpi_gpu.info`: which MPI this is, whether it is CUDA-aware and why, which
launcher started this process, which path each kind of tensor takes, then the user settings.

    python -m torch_mpi_gpu.info                 # the summary and the user settings
    python -m torch_mpi_gpu.info --all           # also the tuning, build and test settings
    python -m torch_mpi_gpu.info --json [--all]  # the same as JSON
    python -m torch_mpi_gpu.info --settings-markdown TIER   # a docs table: user|tuning|build|test
"""

import json
import sys

import torch
import torch.distributed as dist

from . import _C, build_info, config, detect_launcher

USAGE = ("usage: python -m torch_mpi_gpu.info [--all] [--json] "
         "| --settings-markdown {" + "|".join(config.TIERS) + "}")


def _cuda_paths(which=None):
    path, reason = (which or _C.cuda_path)()
    seen = "" if torch.cuda.is_available() else " [no CUDA device visible to this process]"
    return f"{path}: {reason}{seen}"


def _cuda_aware(mpi):
    """One line: whether CUDA tensors go to MPI as device pointers, and what says so."""
    said = {1: "yes", 0: "no", -1: "unknown"}
    library = (f"the library says compile time {said[mpi['cuda_aware_compile_time']]}, "
               f"run time {said[mpi['cuda_aware_run_time']]}")
    setting = config.get("TORCH_MPIGPU_CUDA_AWARE")
    if setting != "auto":
        verdict = "yes (TORCH_MPIGPU_CUDA_AWARE=1)" if setting == "1" else \
            "no (TORCH_MPIGPU_CUDA_AWARE=0: staged through pinned host memory)"
    else:
        verdict = "yes" if mpi["cuda_aware_run_time"] == 1 else "no"
    return f"{verdict}: {library}; probe: {mpi['cuda_aware_probe']}"


def _launcher_line(found, mpi):
    world = f"rank {mpi['world_rank']} of {mpi['world_size']}"
    if found is None:
        return f"none found ({world}: a world of one unless an MPI launcher started it)"
    local = "" if found["local_rank"] is None else f", local rank {found['local_rank']}"
    return f"{found['launcher']} ({world}{local})"


def _settings(all_tiers):
    tiers = config.TIERS if all_tiers else ("user",)
    return {tier: {s.name: (s.value if s.is_set else f"{s.shown_default or s.default} (default)")
                   for s in config.of_tier(tier)}
            for tier in tiers}


def collect(all_tiers=False):
    mpi = _C.mpi_info()
    return {
        "torch_mpi_gpu": __import__("torch_mpi_gpu").__version__,
        "torch": torch.__version__,
        "mpi_library": mpi["library_version"],
        "mpi_standard": mpi["standard"],
        "mpi_thread_level": mpi["thread_level"],
        "mpi_initialized_by_torch_mpi_gpu": mpi["initialized_by_us"],
        "cuda_aware": _cuda_aware(mpi),
        "fault_tolerance": mpi["fault_tolerance"],
        "launcher": _launcher_line(detect_launcher(), mpi),
        "paths": {
            "cpu tensors": "cpu: MPI on host memory (non-contiguous tensors are copied)",
            "cuda tensors": _cuda_paths(),
            "cuda reductions": _cuda_paths(_C.cuda_reduce_path),
            "other devices (xpu, ...)": "via-cpu (host copy); device types served: "
                                        + ", ".join(dist.Backend.backend_capability["mpigpu"]),
            "reductions": _C.reduction_rule(),
        },
        "settings": _settings(all_tiers),
        "built_with": build_info(),
        "extension_has_cuda_sources": _C.with_cuda(),
    }


def _print_text(data):
    first = data["mpi_library"].split(",")[0]
    print(f"torch_mpi_gpu {data['torch_mpi_gpu']} on torch {data['torch']}")
    print(f"MPI          {first} (MPI {data['mpi_standard']}, {data['mpi_thread_level']})")
    print(f"CUDA-aware   {data['cuda_aware']}")
    print(f"launcher     {data['launcher']}")
    print(f"ULFM         {data['fault_tolerance']}")
    print("tensors")
    for kind, path in data["paths"].items():
        print(f"    {kind}: {path}")
    for tier, values in data["settings"].items():
        more = "" if len(data["settings"]) > 1 else " (--all: also tuning, build and test settings)"
        print(f"{tier} settings{more}")
        for name, value in values.items():
            print(f"    {name}: {value}")
    built = data["built_with"]
    print(f"built against {built.get('mpi_source')} at {built.get('mpi_prefix')}; "
          f"CUDA sources: {data['extension_has_cuda_sources']}")
    print(f"full MPI version: {data['mpi_library']}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        return 0
    if "--settings-markdown" in argv:  # the docs' tables
        at = argv.index("--settings-markdown")
        tier = argv[at + 1] if at + 1 < len(argv) else "user"
        print(config.markdown_table(tier))
        return 0
    unknown = [a for a in argv if a not in ("--all", "--json")]
    if unknown:
        print(f"torch_mpi_gpu.info: unknown argument {unknown[0]}\n{USAGE}", file=sys.stderr)
        return 2
    data = collect(all_tiers="--all" in argv)
    if "--json" in argv:
        print(json.dumps(data, indent=2, default=str))
    else:
        _print_text(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
