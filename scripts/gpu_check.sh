#!/usr/bin/env bash
# The GPU run, for a lent machine with a GPU and no MPI of its own (the H100/H200 machines), in one
# call of at most ~9 minutes: unpacks the CUDA-aware Open MPI tarball (and NCCL 2.30 when carried),
# builds torch_mpi_gpu against them and the machine's CUDA torch, probes two ranks on the one GPU,
# runs the CUDA benchmark (mpigpu auto and each algorithm and message path forced, the previous
# default (MPI's reduction staged), raw MPI, gloo on host copies, NCCL 2.30 on the same GPU), then
# the GPU tests. Every step is time-boxed so a lease ends with whatever finished; everything goes
# to $OUT, at most 11 files with its MANIFEST.json (default: a new run folder,
# benchmarks/results/<date>_<gpu>_gpu-check/; torch_mpi_gpu/manifest.py). GIT_COMMIT names the
# commit in the manifest where the tree travels without .git (a lent machine's copy).
#
#   OMPI_TARBALL=.carry/openmpi-cuda-4.1.4.tar.gz NCCL_TARBALL=.carry/nccl-2.30.7-sm90.tar.xz \
#     GIT_COMMIT=$(git rev-parse --short HEAD) scripts/gpu_check.sh
#
# (.carry/ may also hold a setuptools >= 77 wheel, used only where the image's setuptools is older.)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# (the helper by its path: it needs only the standard library and torch, not the build)
OUT="${OUT:-$(python "$ROOT/torch_mpi_gpu/manifest.py" new gpu-check --device cuda --results "$ROOT/benchmarks/results")}"
OUT="${OUT:-$ROOT/gpu-results}"
TARBALL="${OMPI_TARBALL:-$ROOT/.carry/openmpi-cuda-4.1.4.tar.gz}"
NCCL_TARBALL="${NCCL_TARBALL:-$ROOT/.carry/nccl-2.30.7-sm90.tar.xz}"
ALLREDUCE_BUDGET_S="${ALLREDUCE_BUDGET_S:-120}"
OTHERS_BUDGET_S="${OTHERS_BUDGET_S:-70}"
TEST_BUDGET_S="${TEST_BUDGET_S:-300}"
# CALL_BUDGET_S: the seconds this whole call may take (the run's timeout_s less a margin for the
# transfers); the tests get what is left of it, at most TEST_BUDGET_S, so a lease spent on a slow
# build or benchmark still ends with a test log rather than a killed call. 0: no such limit.
CALL_BUDGET_S="${CALL_BUDGET_S:-0}"
# GPU_TESTS: what pytest runs at the end (files and -k, from tests/), TEST_RUNS times in a row
# (each run's log kept; at the budget pytest gets SIGINT, so the log still ends with each failure's
# message); BENCH=0 skips the NCCL reference and the benchmarks (a quick check of a change, or
# #24's runs; one run of test_gpu.py at 4 workers can outlast 160 s, so three runs need more
# than one call); SANITIZER=0 skips compute-sanitizer (memcheck,
# racecheck, synccheck over a short CUDA soak at 2 ranks, SANITIZER_BUDGET_S each; memcheck and
# racecheck again over the node algorithm's device slots, ordered from the host and on the
# device, SANITIZER_NODE_BUDGET_S each);
# SANITIZER=background runs those alongside the tests (they check correctness, not time), so they
# cost the lease no time of their own; BUILD=0 reuses the build a previous call on the
# same warm machine installed (a second call for the benchmarks).
GPU_TESTS="${GPU_TESTS:-test_gpu.py}"
TEST_RUNS="${TEST_RUNS:-1}"
TEST_WORKERS="${TEST_WORKERS:-4}"
BENCH="${BENCH:-1}"
BUILD="${BUILD:-1}"
SANITIZER="${SANITIZER:-1}"
SANITIZER_BUDGET_S="${SANITIZER_BUDGET_S:-60}"
SANITIZER_NODE_BUDGET_S="${SANITIZER_NODE_BUDGET_S:-40}"
# What the all_reduce sweep compares (bench --backends); the default is the full comparison.
# mpigpu[ALGO=node]: the node algorithm in CUDA IPC device slots (#22; auto takes it here for
# all_reduce from NODE_SHARED_GPU_ALLREDUCE_BYTES, reduce_scatter from ALGO_MIN_BYTES, all_gather
# at any size), ordered from the host (auto: the ranks share
# the GPU), the node's first rank reducing for both (auto there). Then the same:
#   - with every op's stream events recorded (CUDA_ORDER_EVENTS=always:
#     auto leaves out those whose stream has no work left, the likely third switch of the
#     leader form);
#   - ordered by device flags (forced; each barrier waits for the other process's time slice
#     here).
# mpigpu[NODE_BUFFER_BYTES=0]: auto without the node algorithm (MPI's own, then the ring), so
# "no size slower" shows in one run.
ALLREDUCE_BACKENDS="${ALLREDUCE_BACKENDS:-mpigpu,mpigpu[NODE_BUFFER_BYTES=0],mpigpu[ALGO=node],mpigpu[ALGO=node;CUDA_ORDER_EVENTS=always],mpigpu[ALGO=node;NODE_DEVICE_ORDER=device],mpigpu[ALGO=mpi],mpigpu[ALGO=ring;CUDA_REDUCE=direct],mpigpu[ALGO=allgather;CUDA_REDUCE=direct],mpigpu[ALGO=rhd;CUDA_REDUCE=direct],MPI,gloo-host}"
mkdir -p "$OUT" /tmp/ompi /tmp/nccl
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
# every rank of the tests' jobs exits in full (under Open MPI's mpirun, elsewhere only rank 0 does:
# tests/mp/common.py);
# each rank's CUDA context, IPC mappings and our statics go in the interpreter's teardown
export MPIGPU_TEST_FULL_EXIT=1
step() { echo "=== $(date +%T) $*"; }
step start
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
tar xzf "$TARBALL" -C /tmp/ompi || { echo "no Open MPI tarball at $TARBALL"; exit 1; }
export OPAL_PREFIX=/tmp/ompi/openmpi-cuda MPI_HOME=/tmp/ompi/openmpi-cuda
export PATH="$MPI_HOME/bin:$PATH" LD_LIBRARY_PATH="$MPI_HOME/lib:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export TORCH_MPIGPU_WITH_CUDA=1 MAX_JOBS="${MAX_JOBS:-16}"
# The lent image sets CXX=/opt/gcc/bin/g++, a wrapper that links libstdc++ statically: that
# extension segfaulted at its first formatted error message (setup.py now refuses such a build).
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
echo "compiler: ${CXX:-c++} ($(${CXX:-c++} --version | head -1))"
python -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name())"
NCCL_DIR=
if tar xJf "$NCCL_TARBALL" -C /tmp/nccl 2>/dev/null; then NCCL_DIR=$(ls -d /tmp/nccl/*/ | head -1); fi
# what this call runs, on which machine and MPI, into $OUT/MANIFEST.json (every setting, as run)
settings=""
for v in BUILD BENCH SANITIZER SANITIZER_BUDGET_S SANITIZER_NODE_BUDGET_S TEST_RUNS TEST_WORKERS TEST_BUDGET_S \
         CALL_BUDGET_S ALLREDUCE_BUDGET_S OTHERS_BUDGET_S GPU_TESTS ALLREDUCE_BACKENDS; do
  val=${!v}
  if [[ "$val" =~ ^[A-Za-z0-9_.,/:=+-]*$ ]]; then settings+="$v=$val "; else settings+="$v=\"$val\" "; fi
done
python "$ROOT/torch_mpi_gpu/manifest.py" write "$OUT" --device cuda --ranks 2-4 \
  --what "scripts/gpu_check.sh:$([ "$BENCH" = 1 ] && echo " the CUDA benchmarks (hand-offs, IPC, first use, all_reduce by form, the other ops, NCCL's C reference),")$([ "$SANITIZER" != 0 ] && echo " compute-sanitizer,") the GPU tests ($GPU_TESTS) x$TEST_RUNS" \
  --command "${settings}scripts/gpu_check.sh" --mpi "$(mpirun --version 2>/dev/null | head -1)" \
  --commit "${GIT_COMMIT:-}" || echo "no MANIFEST.json written"

step build
if [ "$BUILD" = 1 ]; then
  # The build needs setuptools >= 77 (pyproject's SPDX license) and the lent machine has no
  # network: a carried wheel (pip download 'setuptools>=77' --no-deps -d .carry) stands in.
  if ! python -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)"; then
    python -m pip install -q --no-deps --no-index "$(ls "$ROOT"/.carry/setuptools-*.whl | tail -1)" \
      || echo "setuptools is older than 77 and no .carry/setuptools-*.whl: the build will say so"
  fi
  python -c "import setuptools; print('setuptools', setuptools.__version__)"
  python -m pip install --no-build-isolation --no-deps -q "$ROOT" || { echo "BUILD FAILED"; exit 1; }
fi
(cd / && python -m torch_mpi_gpu.info)

step "probe: two ranks, one GPU, device buffers"
cat > /tmp/probe.py <<'PY'
import torch, torch.distributed as dist, torch_mpi_gpu
torch_mpi_gpu.select_cuda_device()
dist.init_process_group("mpigpu")
r, w = dist.get_rank(), dist.get_world_size()
x = torch.full((1 << 20,), float(r + 1), device="cuda")
dist.all_reduce(x)
y = torch.empty(w << 20, device="cuda")
dist.all_gather_into_tensor(y, x)
torch.cuda.synchronize()
assert x.eq(w * (w + 1) / 2).all() and y.eq(w * (w + 1) / 2).all(), (x[:3], y[:3])
print(f"probe ok rank {r} path {torch_mpi_gpu._C.cuda_path()[0]} algorithms {torch_mpi_gpu._C.algorithm_runs()}", flush=True)
dist.destroy_process_group()
PY
probe() { timeout 60 mpirun --oversubscribe -np 2 "$@" python /tmp/probe.py; }
if ! probe; then
  echo "probe failed with Open MPI's defaults; retrying without cross-memory-attach"
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  probe || echo "PROBE FAILED: the steps below will show where"
fi
env | grep '^OMPI_MCA' || true

cd "$OUT"
if [ "$BENCH" = 1 ]; then
# what one switch between two processes' time slices costs here, and whether a stray stream
# event (a command with no work) queued by one during the other's kernel costs it a switch (the
# cost model's shared_switch_s; the leader form's third switch, CUDA_ORDER_EVENTS)
step "hand-offs between two processes on the GPU (budget 60s)"
timeout 60 python "$ROOT/benchmarks/shared_gpu_handoff.py" --rounds 200 | tee "$OUT/handoff.txt"
# where a 2-rank job's first seconds go, step by step, alone on the GPU (the tests' launches spend
# ~10 s each outside their checks with 4 workers sharing it; same file)
step "first use: a 2-rank job's start and first ops, step by step (budget 60s)"
timeout 60 mpirun --oversubscribe -np 2 python "$ROOT/benchmarks/first_use_cost.py" | tee -a "$OUT/handoff.txt"
MPI_OK=mpi
timeout 60 mpirun -np 1 python -c "from mpi4py import MPI; print('mpi4py on', MPI.Get_library_version().splitlines()[0])" \
  || { MPI_OK=; echo "mpi4py cannot use this MPI: raw MPI left out of the benchmark"; }
# NCCL 2.30 on the same GPU: torch's NCCL (2.28 here) refuses two ranks on one GPU and a
# preloaded 2.30 did not replace it, so benchmarks/nccl_bench.cu links NCCL 2.30 directly.
EXTERNAL=()
if [ -n "$NCCL_DIR" ]; then
  step "NCCL $NCCL_DIR (C reference)"
  if OMPI_CXX=${CXX:-g++} timeout 90 nvcc -O2 -ccbin mpicxx -arch=sm_90 -I"$NCCL_DIR" "$ROOT/benchmarks/nccl_bench.cu" \
       -L"$NCCL_DIR/lib" -l:libnccl.so.2 -Xlinker -rpath="$NCCL_DIR/lib" -o /tmp/nccl_bench; then
    timeout 90 mpirun --oversubscribe -np 2 -x NCCL_MULTI_RANK_GPU_ENABLE=1 /tmp/nccl_bench "$OUT/nccl.json" 16 268435456 4 \
      && EXTERNAL=(--external "$OUT/nccl.json")
  fi
fi
backends() {  # the list without raw MPI (token MPI) when mpi4py cannot use this MPI
  local list=",$1,"
  list=${list//,MPI,/${MPI_OK:+,$MPI_OK},}
  list=${list#,}; echo "${list%,}"
}
bench() {  # budget, name, extra bench args...
  local budget=$1 name=$2
  shift 2
  step "benchmark $name (budget ${budget}s)"
  timeout "$budget" mpirun --oversubscribe -np 2 \
    python -m torch_mpi_gpu.bench --device cuda --no-progress -w 3 "${EXTERNAL[@]}" \
    --json "$name.json" --plot "$name.png" "$@" 2>&1 | grep -v '^\[vm'
  echo "exit ${PIPESTATUS[0]}"
}
# all_reduce: auto, the algorithms and message paths that auto chooses between, the previous
# default (MPI's reduction, staged), raw MPI, gloo on host copies, NCCL 2.30 (C reference)
bench "$ALLREDUCE_BUDGET_S" allreduce_cuda_2ranks --ops allreduce -b 16 -e 256M -f 4 -n 20 \
  --backends "$(backends "$ALLREDUCE_BACKENDS")"
# the other ops: mpigpu's defaults against the previous default, raw MPI and NCCL
bench "$OTHERS_BUDGET_S" others_cuda_2ranks --ops reduce_scatter,allgather,broadcast -b 16 -e 256M -f 8 -n 20 \
  --backends "mpigpu,mpigpu[NODE_BUFFER_BYTES=0],mpigpu[ALGO=node],mpigpu[ALGO=node;CUDA_ORDER_EVENTS=always],mpigpu[ALGO=mpi]${MPI_OK:+,$MPI_OK}"
# #22's targets from the two sweeps, met or not, and every form at the target sizes; "no size
# slower" against GPU_TARGETS_BASELINE (a run folder or its all_reduce JSON), else the newest
# archived gpu-check run on this kind of GPU with an all_reduce sweep
slug=$(python "$ROOT/torch_mpi_gpu/manifest.py" slug --device cuda 2>/dev/null)
baseline="${GPU_TARGETS_BASELINE:-$(ls -d "$ROOT"/benchmarks/results/*_"${slug:-none}"_gpu-check*/allreduce_cuda_2ranks.json \
  2>/dev/null | grep -vF "$OUT/" | tail -1)}"
python "$ROOT/benchmarks/gpu_targets.py" "$OUT" ${baseline:+--baseline "$baseline"} | tee targets.txt || true

fi

sanitize() {
  # every rank under the sanitizer; its report (and 'ERROR SUMMARY: n errors') per tool.
  # Open MPI 4.1.4 page-locks its shared-memory segment with cuMemHostRegister at the first
  # device receive; on the lent H200 that call fails (CUDA_ERROR_INVALID_VALUE, also the warning
  # at every start), and memcheck counts it as each rank's one error. Switched
  # off here, so the count is ours; it only speeds Open MPI's host staging.
  export OMPI_MCA_mpi_common_cuda_register_memory=0
  for tool in memcheck racecheck synccheck; do
    step "compute-sanitizer --tool $tool over 40 soak cases, 2 ranks (budget ${SANITIZER_BUDGET_S}s)"
    (cd "$ROOT/tests/mp" && MPIGPU_TEST_DEVICE=cuda MPIGPU_RANDOM_CASES=40 MPIGPU_SOAK_MAX_ELEMENTS=20000 \
      TORCH_MPIGPU_CUDA_DIRECT_BYTES=32768 TORCH_MPIGPU_ALGO_MIN_BYTES=65536 TORCH_MPIGPU_ALGO_PIECE_BYTES=8192 \
      TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES=24576 \
      timeout "$SANITIZER_BUDGET_S" mpirun --oversubscribe -np 2 \
      "$CUDA_HOME/bin/compute-sanitizer" --tool "$tool" --error-exitcode 9 python device_soak.py) \
      >> "$OUT/sanitizer.log" 2>&1
    echo "=== $tool exit $?" | tee -a "$OUT/sanitizer.log"
  done
  # the node algorithm's CUDA IPC slots (#22): memcheck ordered from the host (auto there: the
  # leader form, the first rank reducing for both), racecheck ordered by the device-flag kernel
  for spec in memcheck:host:auto racecheck:device:auto; do
    IFS=: read -r tool order leader <<< "$spec"
    step "compute-sanitizer --tool $tool, node algorithm (device slots, ordered: $order, leader: $leader), 20 soak cases, 2 ranks (budget ${SANITIZER_NODE_BUDGET_S}s)"
    (cd "$ROOT/tests/mp" && MPIGPU_TEST_DEVICE=cuda MPIGPU_RANDOM_CASES=20 MPIGPU_SOAK_MAX_ELEMENTS=20000 \
      TORCH_MPIGPU_ALGO=node TORCH_MPIGPU_NODE_DEVICE_ORDER=$order TORCH_MPIGPU_NODE_DEVICE_BUFFER_BYTES=65536 \
      TORCH_MPIGPU_NODE_LEADER=$leader TORCH_MPIGPU_TIMEOUT=60 \
      timeout "$SANITIZER_NODE_BUDGET_S" mpirun --oversubscribe -np 2 \
      "$CUDA_HOME/bin/compute-sanitizer" --tool "$tool" --error-exitcode 9 python device_soak.py) \
      >> "$OUT/sanitizer.log" 2>&1
    echo "=== $tool (node, $order, leader $leader) exit $?" | tee -a "$OUT/sanitizer.log"
  done
  grep -E "ERROR SUMMARY|=== .* exit" "$OUT/sanitizer.log"
}
case "$SANITIZER" in
  1) sanitize ;;
  background) step "compute-sanitizer runs alongside the tests (its steps print as they start)"; sanitize & sanitizer_pid=$! ;;
esac

status=0
# what is left of CALL_BUDGET_S for the tests: less pytest's 30 s to write its report after SIGINT
# and 15 s to collect the background sanitizer
tests_budget() {
  local left=$((CALL_BUDGET_S - SECONDS - 45))
  if [ "$CALL_BUDGET_S" -gt 0 ] && [ "$left" -lt "$TEST_BUDGET_S" ]; then echo $((left > 30 ? left : 30)); else echo "$TEST_BUDGET_S"; fi
}
for run in $(seq 1 "$TEST_RUNS"); do
  budget=$(tests_budget)
  step "GPU tests, run $run of $TEST_RUNS: $GPU_TESTS (budget ${budget}s)"
  eval "test_args=($GPU_TESTS)"  # a shell-quoted list of pytest arguments ("-k 'a or b'")
  # the tests in TEST_WORKERS processes at once (pytest-xdist, on the lent image): each is its
  # own mpirun, and the 16 cores and one GPU hold four at a time
  if [ "$TEST_WORKERS" -gt 1 ] && python -c "import xdist" 2>/dev/null; then test_args+=(-n "$TEST_WORKERS"); fi
  # each test's time as it ends, and each job's seconds by section (tests/conftest.py): a run cut
  # off at the budget prints no --durations, yet says where its time went
  timings="/tmp/test_gpu_run$run.timings"
  rm -f "$timings"
  (cd "$ROOT/tests" && MPIGPU_TEST_TIMINGS="$timings" timeout -s INT -k 30 "$budget" \
    python -m pytest -v -rs --durations=0 -p no:cacheprovider "${test_args[@]}") > "$OUT/test_gpu_run$run.log" 2>&1
  rc=$?
  { echo "=== run $run: each test as it ended (seconds, outcome), and its jobs' seconds by section"
    cat "$timings" 2>/dev/null; } >> "$OUT/test_gpu_run$run.log"
  tail -25 "$OUT/test_gpu_run$run.log"
  [ "$rc" = 0 ] || status=$rc
done
if [ -n "${sanitizer_pid:-}" ]; then
  # the sanitizer's own steps are time-boxed; past the call's budget it is cut short, and its
  # log says how far it got
  if [ "$CALL_BUDGET_S" -gt 0 ]; then
    for _ in $(seq 1 $((CALL_BUDGET_S - SECONDS > 0 ? CALL_BUDGET_S - SECONDS : 1))); do
      kill -0 "$sanitizer_pid" 2>/dev/null || break
      sleep 1
    done
    kill -- "$sanitizer_pid" 2>/dev/null && echo "sanitizer cut short at the call's budget"
  fi
  wait "$sanitizer_pid"
fi
step done
exit "$status"
