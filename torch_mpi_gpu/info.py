"""`python -m torch_mpi_gpu.info`: what MPI this is, what it can do, which paths tensors take."""

import json
import sys

import torch
import torch.distributed as dist

from . import _C, build_info, config, detect_launcher


def _cuda_paths(which=None):
    path, reason = (which or _C.cuda_path)()
    seen = "" if torch.cuda.is_available() else " [no CUDA device visible to this process]"
    return f"{path}: {reason}{seen}"


def collect():
    mpi = _C.mpi_info()
    aware = {1: "yes", 0: "no", -1: "unknown"}
    return {
        "torch_mpi_gpu": __import__("torch_mpi_gpu").__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "mpi_library": mpi["library_version"],
        "mpi_standard": mpi["standard"],
        "mpi_thread_level": mpi["thread_level"],
        "mpi_initialized_by_torch_mpi_gpu": mpi["initialized_by_us"],
        "mpi_world": f"rank {mpi['world_rank']} of {mpi['world_size']}",
        "cuda_aware_mpi": f"compile time: {aware[mpi['cuda_aware_compile_time']]}, "
                          f"run time: {aware[mpi['cuda_aware_run_time']]}",
        "cuda_aware_probe": mpi["cuda_aware_probe"],
        "built_with": build_info(),
        "extension_has_cuda_sources": _C.with_cuda(),
        "launcher": detect_launcher(),
        "paths": {
            "cpu tensors": "cpu: MPI on host memory (non-contiguous tensors are copied)",
            "cuda tensors": _cuda_paths(),
            "cuda reductions": _cuda_paths(_C.cuda_reduce_path),
            "other devices (xpu, ...)": "via-cpu (host copy); device types served: "
                                        + ", ".join(dist.Backend.backend_capability["mpigpu"]),
            "reductions": _C.reduction_rule(),
        },
        "settings": {s.name: (s.value if s.is_set else f"{s.shown_default or s.default} (default)")
                     for s in config.SETTINGS},
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--settings-markdown" in argv:  # docs/settings.md's table
        print(config.markdown_table())
        return 0
    data = collect()
    if "--json" in argv:
        print(json.dumps(data, indent=2, default=str))
        return 0
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"    {k}: {v}")
        else:
            print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
