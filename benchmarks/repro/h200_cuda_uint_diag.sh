#!/usr/bin/env bash
# Reproduces collectives.py failing on CUDA (torch 2.11 lacks uint16/32/64 kernels): lent H200, 2026-11-28.
# One-off diagnosis on the lent GPU (2026-11-28, second call): why collectives.py fails on CUDA.
set -uo pipefail
ROOT=$PWD; OUT=${OUT:-$ROOT/gpu-results}; mkdir -p $OUT /tmp/ompi
exec > >(tee "$OUT/diag.log") 2>&1
export PYTHONUNBUFFERED=1
tar xzf .carry/openmpi-cuda-4.1.4.tar.gz -C /tmp/ompi
export OPAL_PREFIX=/tmp/ompi/openmpi-cuda MPI_HOME=/tmp/ompi/openmpi-cuda
export PATH="$MPI_HOME/bin:$PATH" LD_LIBRARY_PATH="$MPI_HOME/lib:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0 TORCH_MPIGPU_WITH_CUDA=1 MAX_JOBS=16 CXX=/usr/bin/g++ CC=/usr/bin/gcc
echo "=== $(date +%T) torch ops on CUDA unsigned dtypes (torch 2.11)"
python - <<'PY'
import torch
for dt in (torch.uint16, torch.uint32, torch.uint64):
    a = torch.arange(6).to(dt).cuda(); b = torch.ones(6, dtype=torch.int64).to(dt).cuda()
    ops = {"zeros": lambda: torch.zeros(4, dtype=dt, device="cuda"), "full": lambda: torch.full((4,), 3, dtype=dt, device="cuda"),
           "clone": lambda: a.clone(), "eq": lambda: a == b, "ne": lambda: a != b, "eq0.all": lambda: (a[1::2] == 0).all(),
           "to64": lambda: a.to(torch.int64), "view_u8": lambda: a.view(torch.uint8), "equal": lambda: torch.equal(a, b),
           "stack": lambda: torch.stack([a, b]), "copy_": lambda: torch.empty_like(a).copy_(a), "chunk": lambda: a.chunk(2),
           "cat": lambda: torch.cat([a, b]), "sum": lambda: a.sum(), "min": lambda: torch.minimum(a, b), "band": lambda: a & b,
           "mul": lambda: a * b, "add": lambda: a + b, "empty_like": lambda: torch.empty_like(a), "cpu": lambda: a.cpu(),
           "fill_": lambda: torch.empty_like(a).fill_(7), "zero_": lambda: torch.empty_like(a).zero_()}
    bad = []
    for name, f in ops.items():
        try: f(); torch.cuda.synchronize()
        except Exception as e: bad.append(f"{name}: {str(e).splitlines()[0][:100]}")
    print(dt, "fails:", bad or "none")
PY
echo "=== $(date +%T) build"
python -m pip install --no-build-isolation --no-deps -q . || { echo BUILD FAILED; exit 1; }
cd tests/mp
coll() { # name, np, env...
  local name=$1 np=$2; shift 2
  env "$@" timeout 90 mpirun --oversubscribe -np $np python collectives.py > /tmp/$name.log 2>&1
  echo "=== collectives $name exit $?: $(grep -c 'FAIL' /tmp/$name.log) FAIL lines"
  grep 'FAIL' /tmp/$name.log | sed 's/n=[0-9]*/n=N/; s/seed=[0-9]*//' | cut -c1-260 | sort | uniq -c | sort -rn | head -25
  grep -v 'FAIL\|checks passed\|behaviour' /tmp/$name.log | tail -15
}
echo "=== $(date +%T) collectives.py, 2 ranks"
coll cuda2 2 MPIGPU_TEST_DEVICE=cuda &
coll mixed2 2 MPIGPU_TEST_DEVICE=mixed &
coll node2 2 MPIGPU_TEST_DEVICE=cuda TORCH_MPIGPU_ALGO=node TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES=65536 MPIGPU_EXPECT_NODES="1 node x 2 ranks" &
wait
echo "=== $(date +%T) memcheck without Open MPI's buffer registration"
for node in 0 1; do
  extra=(); [ $node = 1 ] && extra=(TORCH_MPIGPU_ALGO=node TORCH_MPIGPU_NODE_DEVICE_ORDER=device TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES=65536)
  env OMPI_MCA_mpi_common_cuda_register_memory=0 MPIGPU_TEST_DEVICE=cuda MPIGPU_RANDOM_CASES=40 MPIGPU_SOAK_MAX_ELEMENTS=20000 \
    TORCH_MPIGPU_CUDA_DIRECT_BYTES=32768 TORCH_MPIGPU_ALGO_MIN_BYTES=65536 TORCH_MPIGPU_ALGO_PIECE_BYTES=8192 "${extra[@]}" \
    timeout 60 mpirun --oversubscribe -np 2 $CUDA_HOME/bin/compute-sanitizer --tool memcheck --error-exitcode 9 python device_soak.py \
    > $OUT/memcheck_node$node.log 2>&1
  echo "=== memcheck node=$node exit $?"; grep "ERROR SUMMARY\|checks passed" $OUT/memcheck_node$node.log
done &
cd ..
echo "=== $(date +%T) the GPU tests the first call never reached"
timeout 110 python -m pytest -q -rfEs -n 4 -p no:cacheprovider --durations=0 test_gpu.py \
  -k "ddp or probe or without_ipc or stuck" > $OUT/tests_rest.log 2>&1
echo "=== pytest exit $?"; grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" $OUT/tests_rest.log | cut -c1-400 | tail -20
wait
echo "=== $(date +%T) done"
