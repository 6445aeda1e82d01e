#!/usr/bin/env bash
# The host side under AddressSanitizer and UndefinedBehaviorSanitizer: builds the extension with
# -fsanitize=address,undefined into a build folder of its own (the venv's install is untouched),
# then runs the multi-rank scripts of tests/mp against it, every rank with the sanitizers'
# runtimes preloaded (Python and torch are not instrumented; our code and every memcpy are).
# Any report fails the run. By hand, not in CI (about 10 minutes on the 2-core VM: the build
# without the precompiled header is most of it); the GPU side's counterpart is compute-sanitizer
# in scripts/gpu_check.sh.
#
#   scripts/sanitize_cpu.sh [VENV]        # default .venv (made by scripts/setup_env.sh)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "${1:-$ROOT/.venv}" && pwd)"
BUILD="${SANITIZE_BUILD_DIR:-/tmp/mpigpu-sanitize}"
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# every rank exits in full (tests/mp/common.py: else, under Open MPI, only rank 0), its teardown
# instrumented too
export MPIGPU_TEST_FULL_EXIT=1

echo "=== build with -fsanitize=address,undefined into $BUILD"
# CFLAGS/LDFLAGS reach every compile and the link; the precompiled header would need the same
# flags, so it is off
(cd "$ROOT" && TORCH_MPIGPU_WITH_CUDA=0 TORCH_MPIGPU_PRECOMPILED_HEADER=0 MAX_JOBS="${MAX_JOBS:-2}" \
  CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" LDFLAGS="-fsanitize=address,undefined" \
  "$PY" setup.py -q build_ext --build-temp "$BUILD/tmp" --build-lib "$BUILD/lib" >"$BUILD.log" 2>&1) \
  || { tail -30 "$BUILD.log"; echo "SANITIZER BUILD FAILED (log: $BUILD.log)"; exit 1; }
# the installed package's Python files with the instrumented _C beside them, first on PYTHONPATH
installed="$(cd / && "$PY" -c 'import os, torch_mpi_gpu; print(os.path.dirname(torch_mpi_gpu.__file__))')"
rm -rf "$BUILD/pkg" && mkdir -p "$BUILD/pkg" && cp -r "$installed" "$BUILD/pkg/"
cp "$BUILD"/lib/torch_mpi_gpu/_C*.so "$BUILD/pkg/torch_mpi_gpu/"
runtimes="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"

# the thresholds lowered so that small messages take every algorithm's pieces and chunks
SMALL=(TORCH_MPIGPU_NODE_BUFFER_BYTES=4096 TORCH_MPIGPU_NODE_ONE_SHOT_BYTES=512
       TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES=1024
       TORCH_MPIGPU_ALGO_MIN_BYTES=2048 TORCH_MPIGPU_ALGO_PIECE_BYTES=1024
       TORCH_MPIGPU_NODE_ACROSS_MIN_BYTES=1024 TORCH_MPIGPU_FUSE_BELOW_BYTES=256
       MPIGPU_SOAK_MAX_ELEMENTS=20000)
failed=0
run() {  # expected exit status, ranks, "script args", settings...
  local want=$1 np=$2 script=$3
  shift 3
  local log="$BUILD/run.log"
  # the built-against MPI's launcher and its flags (torch_mpi_gpu.mpirun), Open MPI or Hydra
  (cd "$ROOT/tests/mp" && env "$@" timeout 600 "$PY" -I -m torch_mpi_gpu.mpirun -np "$np" \
    -x LD_PRELOAD="$runtimes" -x PYTHONPATH="$BUILD/pkg" \
    -x ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:exitcode=23 \
    -x UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=0 \
    "$PY" $script) >"$log" 2>&1
  local rc=$? reports
  reports=$(grep -a -c -E "runtime error:|ERROR: AddressSanitizer" "$log")
  local settings="$*"
  settings=${settings/"${SMALL[*]}"/(small thresholds)}
  printf '%-4s exit %-3s (want %s) %2s ranks  %s  %s\n' \
    "$([ "$rc" = "$want" ] && [ "$reports" = 0 ] && echo ok || echo FAIL)" "$rc" "$want" "$np" "$script" "$settings"
  if [ "$rc" != "$want" ] || [ "$reports" != 0 ]; then
    failed=1
    grep -a -E -A12 "runtime error:|ERROR: AddressSanitizer" "$log" | head -40
    [ "$reports" != 0 ] || tail -20 "$log"
  fi
}
echo "=== tests/mp under ASan + UBSan (ok: the expected exit status and no sanitizer report)"
run 0 3 collectives.py
run 0 3 random_ops.py
run 0 3 device_soak.py MPIGPU_RANDOM_CASES=600 "${SMALL[@]}" TORCH_MPIGPU_ALGO=node
run 0 4 device_soak.py MPIGPU_RANDOM_CASES=400 "${SMALL[@]}" TORCH_MPIGPU_TEST_PRETEND_NODES=2
run 0 5 device_soak.py MPIGPU_RANDOM_CASES=300 "${SMALL[@]}" TORCH_MPIGPU_ALGO=node TORCH_MPIGPU_TEST_PRETEND_NODES=2
run 0 3 "shared_cpu.py same"  # the node barrier with every rank on one CPU
run 0 4 collectives.py TORCH_MPIGPU_ALGO=node TORCH_MPIGPU_NODE_SINGLE_COPY_BYTES=0 TORCH_MPIGPU_TEST_PRETEND_NODES=2  # all_gather reading peers in place
for algo in ring rhd allgather; do run 0 3 random_ops.py "${SMALL[@]}" TORCH_MPIGPU_ALGO=$algo; done
run 0 3 p2p_stress.py
run 0 3 p2p_groups.py
run 0 3 fusion.py
run 0 4 comm_groups.py
run 0 3 desync.py TORCH_MPIGPU_DESYNC_CHECK=1
run 0 2 ddp.py
run 0 2 fsdp.py
run 0 3 errors.py
run 0 2 "shared_engine.py others-go-on" MPIGPU_TEST_THREAD_LEVEL=serialized TORCH_MPIGPU_TIMEOUT=30 TORCH_MPIGPU_TIMEOUT_ACTION=report
run 0 2 "exits.py pending-async"
run 0 3 "exits.py clean"
# departures (the watchdog's notices, and the store's host holding its store past its destroy)
run 0 2 "exits.py unwaited-receive"
run 0 3 "exits.py staggered-end"
run 0 3 "exits.py staggered-destroy"
# ends that abort the job: the status is the abort's
run 3 3 "stall.py abort" TORCH_MPIGPU_TIMEOUT=2
for mode in exit-in-collective destroy-in-collective host-destroys-in-collective exit-before-send; do
  run 3 3 "exits.py $mode"
done
run 1 2 "shutdown.py destroy cpu" TORCH_MPIGPU_TIMEOUT=3 TORCH_MPIGPU_TIMEOUT_ACTION=report
run 1 2 "shutdown.py abort cpu" TORCH_MPIGPU_TIMEOUT=3 TORCH_MPIGPU_TIMEOUT_ACTION=report
[ "$failed" = 0 ] && echo "=== sanitize_cpu: every run ok ($SECONDS s)" || echo "=== sanitize_cpu: FAILED (above)"
exit "$failed"
