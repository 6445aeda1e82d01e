"""The C++ layers as docs/architecture.md draws them: each folder of csrc/ includes only folders
below it, and no two files include each other (a header and its .cpp count as one module)."""

import re
from collections import defaultdict
from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"
# Bottom to top. cuda/ plugs into paths/ and algorithms/ (registered, never included from above);
# "" is csrc/ itself: the process group, the bindings (which bind testing/'s hooks too), profiling.
LAYERS = ["core", "mpi", "node", "algorithms", "paths", "cuda", "ops", "engine", "store", "testing",
          ""]
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h")


def includes():
    """{module: {modules it includes}}, modules as paths below csrc/ without their suffix."""
    edges = defaultdict(set)
    for path in CSRC.rglob("*"):
        if path.suffix not in SOURCES:
            continue
        module = path.relative_to(CSRC).with_suffix("").as_posix()
        for name in re.findall(r'^#include "([^"]+)"', path.read_text(), re.M):
            target = next((c for c in (CSRC / name, path.parent / name) if c.exists()), None)
            if target is not None:
                included = target.resolve().relative_to(CSRC).with_suffix("").as_posix()
                if included != module:
                    edges[module].add(included)
    return edges


def layer(module):
    folder = module.rsplit("/", 1)[0] if "/" in module else ""
    assert folder in LAYERS, f"csrc/{folder}/ is not a layer of tests/test_layers.py's LAYERS"
    return LAYERS.index(folder)


def test_every_include_points_down_or_sideways():
    upward = [f"{m} -> {t}" for m, targets in includes().items() for t in targets
              if layer(t) > layer(m)]
    assert not upward, "includes that point to a higher layer:\n" + "\n".join(sorted(upward))


def test_no_two_modules_include_each_other():
    edges = includes()
    state, stack, cycles = {}, [], []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert not cycles, "include cycles:\n" + "\n".join(cycles)


def test_the_checks_see_the_tree():
    # a check that finds nothing cannot fail: the tree has its layers and their includes
    edges = includes()
    assert "ops/OpPlan" in edges and "core/Config" in edges["ops/OpPlan"], sorted(edges)
    assert {layer(m) for m in edges} >= {LAYERS.index(x) for x in ("core", "mpi", "ops", "")}
