"""Settings that every rank of a group must share (docs/settings.md: those read at group creation,
not "each rank its own"), compared when a group is made. Where one rank's value differs, every
rank's group creation raises the same DistBackendError naming the setting, each value and the
ranks holding it, instead of ranks choosing different collectives (a hang, or wrong results).
  - the default group: rank 1 alone sets TORCH_MPIGPU_ALGO=ring; then, with it unset again, the
    default group is made and works
  - a subgroup of every rank: the last rank alone sets TORCH_MPIGPU_FUSION_BYTES=0; then, unset,
    the subgroup is made and works
  - a setting each rank keeps its own (TORCH_MPIGPU_TIMEOUT on rank 0 alone): no error
"""

import os

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, run


def raises_naming(c, make, setting, want):
    """make() must raise DistBackendError naming `setting` and each of `want` (value: ranks)."""
    try:
        make()
    except dist.DistBackendError as e:
        text = str(e)
        c.true(f"the error names {setting}", f"{setting} is " in text, text)
        for value, ranks in want.items():
            c.true(f"... and `{value}` on {ranks}", f"`{value}` on {ranks}" in text, text)
        c.true("... and says what to do", "Give every rank the same value" in text, text)
        return
    except Exception as e:  # noqa: BLE001
        c.true("a DistBackendError", False, f"{type(e).__name__}: {e}")
        return
    c.true("group creation failed", False, "no error")


def holders(ranks):
    """How the error lists ranks: "rank 1", "ranks 0, 2", "ranks 0-3"."""
    runs, start = [], None
    for i, r in enumerate(ranks):
        start = r if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            runs.append(str(r) if start == r else f"{start}-{r}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs)


def main():
    rank = torch_mpi_gpu.detect_launcher()["rank"]
    world = torch_mpi_gpu.detect_launcher()["size"]
    c = Checker(f"settings_agreement(np={world})")
    c.rank = rank

    c.section("the default group with a shared setting differing")
    if rank == 1:
        os.environ["TORCH_MPIGPU_ALGO"] = "ring"
    raises_naming(c, lambda: dist.init_process_group("mpigpu"), "TORCH_MPIGPU_ALGO",
                  {"ring": holders([1]), "auto": holders([r for r in range(world) if r != 1])})
    os.environ.pop("TORCH_MPIGPU_ALGO", None)
    c.true("no default group made", not dist.is_initialized(), "initialized")

    c.section("the default group, the setting then the same")
    dist.init_process_group("mpigpu")
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    c.close("all_reduce", t, torch.full((5,), float(sum(range(world)))))

    c.section("a subgroup with a shared setting differing")
    last = world - 1
    if rank == last:
        os.environ["TORCH_MPIGPU_FUSION_BYTES"] = "0"
    raises_naming(c, lambda: dist.new_group(list(range(world))), "TORCH_MPIGPU_FUSION_BYTES",
                  {"0": holders([last]), "67108864": holders(list(range(last)))})
    os.environ.pop("TORCH_MPIGPU_FUSION_BYTES", None)

    c.section("a subgroup, the setting then the same; one each rank keeps its own differing")
    if rank == 0:
        os.environ["TORCH_MPIGPU_TIMEOUT"] = "600"
    group = dist.new_group(list(range(world)))
    os.environ.pop("TORCH_MPIGPU_TIMEOUT", None)
    t = torch.full((7,), float(rank + 1))
    dist.all_reduce(t, group=group)
    c.close("all_reduce on the subgroup", t, torch.full((7,), float(world * (world + 1) // 2)))
    return c.finish()


if __name__ == "__main__":
    run(main)
