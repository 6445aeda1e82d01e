#!/usr/bin/env bash
# Lint, run first by scripts/test.sh (so by CI):
#   - csrc/ is formatted as .clang-format says    (fix: clang-format -i <file>)
#   - no function in csrc/ is longer than 60 lines (lizard; split it)
#   - Python: no undefined names, unused imports or syntax errors (ruff's pyflakes rules)
# The tools are pinned (formatting changes between clang-format releases) and installed into the
# venv given as $1 (default .venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv}"
cd "$ROOT"
"$VENV/bin/python" -m pip install -q "clang-format==23.1.5" "lizard==1.24.3" "ruff==0.17.6"
mapfile -t sources < <(find csrc -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \
  -o -name '*.h' | sort)
echo "lint: clang-format on ${#sources[@]} files in csrc/"
"$VENV/bin/clang-format" --dry-run --Werror "${sources[@]}"
echo "lint: function length (at most 60 lines)"
"$VENV/bin/lizard" --length 60 --CCN 1000 --warnings_only csrc
echo "lint: ruff (pyflakes rules)"
"$VENV/bin/ruff" check --no-cache --select F,E9 torch_mpi_gpu tests benchmarks scripts examples setup.py
echo "lint: clean"
