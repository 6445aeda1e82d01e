#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and no MPI of its own (the lent H100/H200 machines):
# unpacks the CUDA-aware Open MPI tarball, builds torch_mpi_gpu against it and the machine's
# CUDA torch, runs the GPU tests (2 and 3 ranks sharing the GPU; cuda-direct and cuda-staged),
# then the collectives benchmark on CUDA tensors (mpigpu direct and staged, nccl where it runs,
# raw MPI). Logs and results go to $OUT (default ./gpu-results).
#
#   OMPI_TARBALL=.carry/openmpi-cuda-4.1.4.tar.gz scripts/gpu_check.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-results}"
TARBALL="${OMPI_TARBALL:-$ROOT/.carry/openmpi-cuda-4.1.4.tar.gz}"
mkdir -p "$OUT" "$ROOT/.carry/ompi"
exec > >(tee "$OUT/gpu_check.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
tar xzf "$TARBALL" -C "$ROOT/.carry/ompi"
export OPAL_PREFIX="$ROOT/.carry/ompi/openmpi-cuda" MPI_HOME="$ROOT/.carry/ompi/openmpi-cuda"
export PATH="$MPI_HOME/bin:$PATH" LD_LIBRARY_PATH="$MPI_HOME/lib:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export TORCH_MPIGPU_WITH_CUDA=1
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
python -m pip install --no-build-isolation -q "$ROOT" || { echo "BUILD FAILED"; exit 1; }
(cd / && python -m torch_mpi_gpu.info) | tee "$OUT/info.txt"
cd "$ROOT/tests"
python -m pytest -v -rs test_gpu.py 2>&1 | tee "$OUT/test_gpu.log"
status=${PIPESTATUS[0]}
cd "$OUT"
NCCL_ENV=()
python - <<'PY' && NCCL_ENV=(-x NCCL_MULTI_RANK_GPU_ENABLE=1)
import sys, torch
sys.exit(0 if torch.cuda.nccl.version() >= (2, 30) else 1)
PY
export NCCL_MULTI_RANK_GPU_ENABLE=1
for path in direct staged; do
  aware=$([ $path = direct ] && echo 1 || echo 0)
  TORCH_MPIGPU_CUDA_AWARE=$aware timeout 500 mpirun --oversubscribe -np 2 -x TORCH_MPIGPU_CUDA_AWARE \
    "${NCCL_ENV[@]}" python -m torch_mpi_gpu.bench --device cuda -b 8 -e 64M -f 8 -n 30 \
    --backends mpigpu,nccl,mpi,gloo --no-progress --json "collectives_cuda_2ranks_$path.json" \
    --plot "collectives_cuda_2ranks_$path.png" 2>&1 | tee "collectives_cuda_2ranks_$path.txt"
done
exit "$status"
