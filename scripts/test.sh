#!/usr/bin/env bash
# The test command: sets everything up (venv, torch, MPI, build) and runs the whole suite,
# multi-rank jobs under mpirun at 1-4 ranks included. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
VENV="${MPIGPU_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$ROOT/tests"
exec "$VENV/bin/python" -m pytest -v --durations=10 "$@"
