#!/usr/bin/env bash
# The main job: sets everything up, then trains a small model with DDP over mpigpu on NP ranks
# (default 4) of this machine under mpirun. Extra arguments go to examples/ddp_train.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
VENV="${MPIGPU_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# no fabric here: Open MPI's libfabric transport would spend ~1 s of MPI_Init finding that out
export OMPI_MCA_btl="${OMPI_MCA_btl:-^ofi}"
# The launcher of the MPI the extension was built against, with its flags (torch_mpi_gpu.mpirun):
# another MPI's would start NP worlds of one rank. -I: not the sources in the current folder
exec "$VENV/bin/python" -I -m torch_mpi_gpu.mpirun -np "${NP:-4}" -x OMP_NUM_THREADS=1 \
  "$VENV/bin/python" "$ROOT/examples/ddp_train.py" "$@"
