#!/usr/bin/env bash
# The test command: sets everything up (venv, torch, MPI, build) and runs the whole suite,
# multi-rank jobs under mpirun at 1-4 ranks included, then builds with CUDA (the newest torch's
# CUDA wheel, every CUDA source compiled with nvcc) so a CUDA compile break, or one from torch's
# newest headers, fails too: where a GPU is visible
# the whole suite runs again on that build, elsewhere what the build changes (single-process
# tests, the GPU tests skipping, the core collectives).
# The CPU leg starts with scripts/lint.sh (clang-format, function length, ruff).
# Extra arguments go to pytest. Settings:
#   MPIGPU_TEST_BUILDS          "cpu mpich slurm hosts ompi41 cuda" (default), or any of them
#                               (mpich: the CPU build against PyPI's MPICH, multi-rank suite and
#                               exit tests under Hydra's mpiexec; slurm: the launcher suite under
#                               srun --mpi=pmi2 (MPICH build) on a one-node Slurm cluster and
#                               srun --mpi=pmix (Open MPI build) on two nodes; hosts: two network-namespace hosts,
#                               Open MPI's mpirun across them, names resolving and IP only, and
#                               MPICH's Hydra mpiexec by name; ompi41: the CPU build against
#                               Open MPI 4.1.4, the version of the CUDA-aware build the GPU runs
#                               use (Debian's packages unpacked by scripts/openmpi41.sh, not
#                               installed): the core ops, DDP, FSDP2, launcher and exit tests)
#   MPIGPU_REQUIRE_CUDA_BUILD   1: no nvcc is an error, not a skip (CI sets it)
#   MPIGPU_ALLOW_SKIPS          what may skip instead of failing: slurm, hosts, ompi41 (legs that cannot
#                               start), libraries, torch-version, not-cuda-aware (tests/conftest.py)
#   CUDA_HOME                   default /usr/local/cuda; TORCH_CUDA_ARCH_LIST default 9.0
#   CUDA_TORCH_SPEC             torch for the CUDA build (default torch==2.15.0, the newest on
#                               PyPI; installed past a pip constraint that caps torch lower,
#                               setup_env.sh's MPIGPU_TORCH_UNCAPPED)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

run_suite() {  # venv, label, pytest args...
  local venv=$1 label=$2
  shift 2
  echo "=== $label: pytest with $venv (at $((SECONDS / 60)) min $((SECONDS % 60)) s) ==="
  (cd "$ROOT/tests" && PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -v --durations=10 "$@")
}

CPU_VENV="${MPIGPU_VENV:-$ROOT/.venv}"
MPICH_VENV="$ROOT/.venv-mpich"
CUDA_VENV="$ROOT/.venv-cuda"
OMPI41_VENV="$ROOT/.venv-ompi41"
OMPI41_DIR="$ROOT/.deps/openmpi-4.1"
at_exit=()  # commands run when the script ends, however it ends
trap 'for command in "${at_exit[@]}"; do eval "$command" || true; done' EXIT

# scripts/setup_env.sh; the background setups (below) run it in a session of its own, whose
# autogroup has nice 19: in the tests' autogroup a crowded rank's sched_yield (mpi/Wait.hpp)
# would hand its core to them, idle class or not, until the next tick
setup_env() {
  if [ -n "${SETUP_IN_BACKGROUND:-}" ]; then
    setsid -w sh -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec "$@"' sh "$ROOT/scripts/setup_env.sh"
  else
    "$ROOT/scripts/setup_env.sh"
  fi
}

ready=""  # each setup runs once; "|| return": a failure is the function's status, in the
# background too (where set -e does not reach)
setup_cpu() {
  if [[ "$ready" != *cpu* ]]; then
    MPIGPU_VENV="$CPU_VENV" TORCH_MPIGPU_WITH_CUDA=0 "$ROOT/scripts/setup_env.sh" || return
  fi
  ready="$ready cpu"
}
setup_mpich() {
  if [[ "$ready" != *mpich* ]]; then
    wait_for_background_setup mpich || MPIGPU_VENV="$MPICH_VENV" MPIGPU_MPI_PACKAGE=mpich MPI_HOME= MPIGPU_IN_PLACE=0 \
      TORCH_MPIGPU_WITH_CUDA=0 setup_env || return
  fi
  ready="$ready mpich"
}
setup_ompi41() {  # in a subshell: Open MPI 4.1's variables stay out of the other legs
  if [[ "$ready" != *ompi41* ]] && ! wait_for_background_setup ompi41; then
    (
      eval "$("$ROOT/scripts/openmpi41.sh" "$OMPI41_DIR")"
      # one unit per source file here (the other builds: one per layer), so that setting builds
      # too, and a file that compiles only after another's includes fails
      MPIGPU_VENV="$OMPI41_VENV" MPI_HOME="$OPAL_PREFIX" MPIGPU_MPI_PACKAGE=none MPIGPU_SETUP_EXTRAS=0 MPIGPU_IN_PLACE=0 \
        TORCH_MPIGPU_WITH_CUDA=0 TORCH_MPIGPU_UNITY_BUILD=0 setup_env
    ) || return
  fi
  ready="$ready ompi41"
}
setup_cuda() {
  if [[ "$ready" != *cuda* ]] && ! wait_for_background_setup cuda; then
    # the CUDA torch wheels take ~6 GiB installed, and pip's download sits beside them meanwhile
    echo "CUDA build: $(df -Pk "$ROOT" | awk 'NR == 2 { print int($4 / 1048576) }') GiB free on $ROOT (about 10 needed)"
    MPIGPU_VENV="$CUDA_VENV" TORCH_SPEC="${CUDA_TORCH_SPEC:-torch==2.15.0}" MPIGPU_TORCH_UNCAPPED=1 \
      MPIGPU_IN_PLACE=0 TORCH_MPIGPU_WITH_CUDA=1 setup_env || return
  fi
  ready="$ready cuda"
}

# The later legs' setups (pip installs, builds: ~7 of CI's minutes) run in the background beside
# the earlier legs' tests, in the idle scheduling class: they take only the CPU time the tests
# leave (about a quarter in the CPU leg, where ranks wait on each other and on timeouts) and give
# way at once when a test's process wants a core. One at a time, in the order the legs need them;
# a leg waits for its setup and shows its output then.
BACKGROUND_LOGS="$(mktemp -d)"
background_pid="" background_names=""
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done; kill "$1" 2>/dev/null || true; }
start_background_setups() {  # names (mpich, cuda)
  [ $# -gt 0 ] || return 0
  (
    chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || renice -n 19 -p "$BASHPID" >/dev/null
    ionice -c 3 -p "$BASHPID" >/dev/null 2>&1 || true  # and the disk (pip unpacks ~6 GiB for CUDA)
    SETUP_IN_BACKGROUND=1
    for name; do
      "setup_$name" >"$BACKGROUND_LOGS/$name.log" 2>&1 && status=0 || status=$?
      echo "$status $SECONDS" >"$BACKGROUND_LOGS/$name.status"
      [ "$status" = 0 ] || break
    done
  ) &
  background_pid=$! background_names=" $* "
  at_exit+=("kill_tree $background_pid; rm -rf '$BACKGROUND_LOGS'")
  echo "=== in the background (idle class, an autogroup of their own at nice 19): the setups of ${*} (at $((SECONDS / 60)) min $((SECONDS % 60)) s) ==="
}
wait_for_background_setup() {  # name; false when it was never started
  local name=$1 since=$SECONDS status finished
  [[ "$background_names" == *" $name "* ]] || return 1
  while [ ! -e "$BACKGROUND_LOGS/$name.status" ]; do
    if ! kill -0 "$background_pid" 2>/dev/null && [ ! -e "$BACKGROUND_LOGS/$name.status" ]; then
      cat "$BACKGROUND_LOGS/$name.log" 2>/dev/null || true
      echo "=== the $name setup ended without a status (killed?) ===" >&2
      exit 1
    fi
    sleep 1
  done
  read -r status finished <"$BACKGROUND_LOGS/$name.status"
  echo "=== $name setup, run in the background (done at $((finished / 60)) min $((finished % 60)) s; this leg waited $((SECONDS - since)) s for it) ==="
  cat "$BACKGROUND_LOGS/$name.log"
  if [ "$status" != 0 ]; then
    echo "=== the $name setup FAILED (exit $status) ===" >&2
    exit 1
  fi
}

# A leg that cannot start fails the run, unless MPIGPU_ALLOW_SKIPS names it (tests/conftest.py
# reads the same variable for the tests' own skips): a broken setup never looks green.
leg_cannot_run() {  # kind, why
  if [[ " ${MPIGPU_ALLOW_SKIPS:-} " == *" $1 "* ]]; then
    echo "=== $1 legs SKIPPED (allowed by MPIGPU_ALLOW_SKIPS): $2 ==="
  else
    echo "=== $1 legs FAILED: $2 (set MPIGPU_ALLOW_SKIPS=$1 to skip them instead) ===" >&2
    exit 1
  fi
}

builds="${MPIGPU_TEST_BUILDS:-cpu mpich slurm hosts ompi41 cuda}"
# What the srun legs run: the launcher's variables and the MPI store's rendezvous at 1-4 ranks, the job ending on a failed rank,
# exits, and the core ops and point-to-point at 3 ranks (odd, more than the cores): a launcher
# changes how ranks start and find each other, not the ops, which the default launcher runs at
# 1-4 above. Not DDP and FSDP2: torch's layers over those same ops, nothing a launcher reaches;
# they run under every MPI (Open MPI 5 and 4.1, MPICH) and across the two hosts.
LAUNCHER_TESTS="(launcher or mpi_store or uncaught or clean or killed or stalled or signal or (leaving and exit-in-collective-3) \
or ((p2p_async or (collectives and not algorithm and not split)) and [3])) \
and not shared_mpi_thread"
later_setups="" cuda_setup=""
if [[ " $builds " == *" mpich "* || " $builds " == *" slurm "* || " $builds " == *" hosts "* ]]; then
  later_setups="mpich"
fi
if [[ " $builds " == *" cuda "* ]]; then
  export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  if [ -x "$CUDA_HOME/bin/nvcc" ]; then
    cuda_setup="cuda"  # queued after Open MPI 4.1's (below)
  elif [ "${MPIGPU_REQUIRE_CUDA_BUILD:-0}" = 1 ]; then
    echo "no nvcc at $CUDA_HOME/bin/nvcc: cannot compile the CUDA sources" >&2
    exit 1
  else
    echo "=== CUDA build SKIPPED: no nvcc at $CUDA_HOME/bin/nvcc (set CUDA_HOME) ==="
    builds="${builds/cuda/}"
  fi
fi
# Where the background setups' CPU comes from: the legs after the CPU leg run in the order that
# leaves them the most idle time. The two-host legs, whose ranks wait on the link and on timeouts,
# come right after the CPU leg, the MPICH and Slurm legs after them: the setups fit in the idle
# time of the first three. Open MPI 4.1's setup before CUDA's: the second lane waits for it at its
# start, and the CUDA leg comes last in the first lane.
if [[ " $builds " == *" ompi41 "* ]]; then
  if command -v apt-get >/dev/null; then
    later_setups="$later_setups ompi41"
  else
    leg_cannot_run ompi41 "no apt-get: Open MPI 4.1 comes from Debian's packages (scripts/openmpi41.sh)"
    builds="${builds/ompi41/}"
  fi
fi
later_setups="$later_setups $cuda_setup"
# the CPU venv first, in the foreground: builds share the source tree's build/ folder, one at a time
if [[ " $builds " == *" cpu "* || " $builds " == *" slurm "* || " $builds " == *" hosts "* ]]; then
  setup_cpu
fi
# shellcheck disable=SC2086  # the names, split
start_background_setups $later_setups
if [[ " $builds " == *" cpu "* ]]; then
  echo "=== lint ==="
  "$ROOT/scripts/lint.sh" "$CPU_VENV"
  run_suite "$CPU_VENV" "CPU build" "$@"
fi
if [[ " $builds " == *" hosts "* ]]; then
  if why=$("$ROOT/scripts/two_hosts.sh" check 2>&1); then
    at_exit+=('"$ROOT/scripts/two_hosts.sh" down')  # the test fixture removes them too
    setup_cpu
    # (test_hang_prone: 2 hosts x 2 ranks bound to cores, the launch check 15 times, p2p_groups,
    # a killed and a stalled rank, a waiting rank's threads; IP only: the launch check; at 4
    # ranks FSDP2's HSDP shards inside each host and replicates across, and split groups span
    # both. DDP and FSDP2 at 4 ranks only, 2 x 2: at 2 and 3 the ops under them cross the hosts
    # in the collectives' jobs, one rank per host and 2 + 1)
    # (and a rank killed under ULFM at test_fault_tolerance.py's kill points, victim on either
    # host)
    MPIGPU_TEST_LAUNCHER=two-hosts-names run_suite "$CPU_VENV" \
      "two hosts, names resolve (mpirun)" test_multirank.py test_hang_prone.py test_fault_tolerance.py \
      -k "(launcher or (mpi_store and [4]) or ((ddp or fsdp) and [4]) or (collectives and not algorithm and not split) or hang_prone \
or node_across or communicator or split_groups or (desync and [4]) or surviv) and not (shared_mpi_thread and not [3])" "$@"
    # IP only changes how ranks find the rendezvous (and mpirun its hosts): the launcher, exit and
    # dead-rank tests, and the launch check 5 times; the ops themselves ran by name above (and
    # the stalled rank's report at 2 x 2, by test_hang_prone, there too; the stuck-MPI_Abort
    # backstop only by name: names change no part of it)
    MPIGPU_TEST_LAUNCHER=two-hosts-ip-only run_suite "$CPU_VENV" \
      "two hosts, IP only (mpirun)" test_multirank.py test_reliability.py test_flight_recorder.py \
      test_hang_prone.py -k "(launcher or uncaught or clean or killed or (stalled and not \
test_reliability and not stuck) or p2p_async or (subgroup_sequence and slot) or (leaving and subgroup) or signal) \
and not shared_mpi_thread" "$@"
    # MPICH's Hydra across the same hosts (its rsh launcher through the same agent; the MPICH
    # leg below runs its suite on one host): the launcher, a killed rank and an uncaught
    # exception ending the job, the core ops, DDP, point-to-point (receives from any source:
    # mpi/AnySource.hpp), and the hang-prone jobs at 2 hosts x 2 ranks (not the stuck-MPI_Abort
    # backstop: the process exits by itself, and Hydra's reaction to that is the killed rank's).
    # UCX_TLS=self,tcp: else UCX finds both "hosts" on this one machine and moves their bytes through shared memory (a
    # 16 MiB all_reduce put 17 KB on the veth; with it, 17 MB); ranks of one host keep MPICH's own
    setup_mpich
    UCX_TLS=self,tcp MPIGPU_TEST_LAUNCHER=two-hosts-names run_suite "$MPICH_VENV" \
      "two hosts, MPICH Hydra (mpiexec)" test_multirank.py test_hang_prone.py test_reliability.py \
      -k "(launcher or (mpi_store and [4]) or (collectives and not algorithm and not split) or node_across or ddp \
or p2p_async or hang_prone or killed or signal or (uncaught and collective)) and not shared and not debug_detail \
and not stuck" "$@"
  else
    leg_cannot_run hosts "the two simulated hosts cannot be made here: $why"
  fi
fi
# Two lanes once every setup is done: the Slurm and Open MPI 4.1 legs run in the background beside
# the MPICH and CUDA legs. Alone, the legs of that stretch left much of a core idle (ranks waiting
# on timeouts and on each other). They share nothing: their own venvs and launchers, the Slurm
# cluster and the simulated hosts only in the second lane, the MPICH leg on this host with Hydra.
# Beside each other they slow down (MPICH's ranks poll without yielding); this split balances
# the lanes.
# The second lane's output follows, whole; a failure in either lane fails the run.
second_lane_legs() {
  if [[ " $builds " == *" slurm "* ]]; then
    if why=$("$ROOT/scripts/slurm_cluster.sh" up 2>&1); then
      echo "$why"
      setup_mpich
      MPIGPU_TEST_LAUNCHER=srun-pmi2 run_suite "$MPICH_VENV" \
        "Slurm srun --mpi=pmi2 (MPICH build)" test_multirank.py test_reliability.py test_flight_recorder.py \
        -k "$LAUNCHER_TESTS" "$@"
      # Open MPI under srun --mpi=pmix: a cluster of two nodes on the simulated hosts (a slurmd in
      # each; the test session starts it and stops the one above), from h0 at 2-4 ranks, block
      # placement (0-1 on h0 at 3 and 4 ranks): the launcher suite as above, and hierarchical at
      # 2 x 2. No one-node leg: the same launcher, nothing that one node has and two lack.
      # (MPICH's pmi2 across them: not in CI, docs/testing.md says why.)
      if why=$("$ROOT/scripts/two_hosts.sh" check 2>&1); then
        setup_cpu
        MPIGPU_TEST_LAUNCHER=two-hosts-srun-pmix run_suite "$CPU_VENV" \
          "Slurm srun --mpi=pmix across two simulated hosts (Open MPI build)" test_multirank.py test_reliability.py \
          test_flight_recorder.py -k "($LAUNCHER_TESTS) or node_across" "$@"
      else
        leg_cannot_run hosts "the two simulated hosts cannot be made here: $why"
      fi
      "$ROOT/scripts/slurm_cluster.sh" down
    else
      leg_cannot_run slurm "no one-node Slurm cluster could be started here: $(printf %s "$why" | tail -c 600)"
    fi
  fi
  if [[ " $builds " == *" ompi41 "* ]]; then
    # Open MPI 4.1 (ORTE's mpirun and error handling, MPI 3.1, its own collectives), a minute: the
    # launcher's variables, the core ops, DDP and FSDP2 at 3 ranks, groups over a program's
    # communicator (mpi4py on the same library), and a stalled, a killed and a failing rank ending
    # the job, a clean exit, signals from outside
    setup_ompi41
    (
      eval "$("$ROOT/scripts/openmpi41.sh" "$OMPI41_DIR")"
      run_suite "$OMPI41_VENV" "Open MPI 4.1.4 (CPU build, ORTE's mpirun)" test_multirank.py test_reliability.py \
        -k "((launcher or collectives or ddp or fsdp) and [3] and not algorithm and not split and not shared \
and not debug) or (communicator and 4-multiple) or (uncaught and 3-raise-in-collective) or killed \
or clean_exit or (stalled and [abort]) or (leaving and exit-in-collective-3) or signal" "$@"
    )
  fi
}
cuda_leg() {
  if [[ " $builds " == *" cuda "* ]]; then
    setup_cuda
    (cd / && "$CUDA_VENV/bin/python" -c 'import torch_mpi_gpu as t; assert t._C.with_cuda(), "CUDA sources missing"; print("CUDA build imports; CUDA tensors take", t._C.cuda_path()[0])')
    if (cd / && "$CUDA_VENV/bin/python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'); then
      run_suite "$CUDA_VENV" "CUDA build, GPU visible: the whole suite" "$@"
    else
      # No GPU: the host paths are the CPU leg's code, run there in full. Here what the CUDA build
      # changes, as a smoke set: the single-process tests (CUDA path choice, settings, hooks), the
      # GPU tests (which must skip cleanly), the collectives and DDP at 2 ranks, and the tests' own
      # device beside CUDA's registered paths (alone at 2 ranks, mixed with CPU ranks at 3), and
      # splitting on it (this leg's torch, 2.15 as 2.14, keeps split_ranks' order where 2.13 sorts).
      # And, this leg's torch being the newest, the rest of scripts/torch_versions.sh's 2-rank
      # smoke (FSDP2, point-to-point groups, the backend surface: what a new torch changes).
      # (the single-process files by their file names: "test_settings" alone would also pick
      # test_docs.py's and test_multirank.py's test_settings_* tests)
      run_suite "$CUDA_VENV" "CUDA build, no GPU: what the build changes" \
        test_launch_env.py test_watchdog.py test_settings.py test_algorithm_choice.py test_build.py \
        test_observability.py test_benchmarks.py test_docs.py test_gpu.py test_multirank.py \
        -k "test_launch_env.py or test_watchdog.py or test_settings.py or test_algorithm_choice.py \
or test_build.py or test_observability.py or test_benchmarks.py or test_readme_and_docs_links_resolve \
or test_our_code_calls_torchs_current_collective_names or test_gpu or ((test_collectives or test_ddp_matches \
or test_fsdp2 or test_p2p_async_groups or backend_surface) and [2] and not algorithm and not split and not shared \
and not crowding) or device_of_its_own or split_groups" "$@"
    fi
  fi
}
# The README's and docs' runnable commands, as written, from the repository root with the CPU
# venv first on PATH (scripts/doc_commands.py), once every build is done: one of them builds in
# place, and the builds share build/units.
doc_commands_step() {
  if [[ " $builds " == *" cpu "* ]]; then
    echo "=== the docs' commands, as written (at $((SECONDS / 60)) min $((SECONDS % 60)) s) ==="
    MPIGPU_VENV="$CPU_VENV" "$CPU_VENV/bin/python" "$ROOT/scripts/doc_commands.py"
  fi
}
if [[ " $builds " == *" mpich "* ]]; then
  setup_mpich  # here, not in both lanes at once (builds share the build/ folder)
  # Both lanes' jobs make node segments in the one /dev/shm, and each lane kills ranks on purpose:
  # a segment one lane's killed job leaves shows up in the other's leak check (CI met this), so
  # from here the check only cleans (the legs above, alone on the machine, assert it)
  export MPIGPU_TEST_LANES_SHARE_DEV_SHM=1
  SECOND_LANE_LOG="$(mktemp)"
  echo "=== in a second lane, beside the MPICH and CUDA legs: the Slurm and Open MPI 4.1 legs (their output follows) ==="
  (
    # The second lane first waits for Open MPI 4.1's setup, the last in the background: it may
    # run apt-get, and so may `slurm_cluster.sh up` (apt's locks fail the one that comes
    # second). The first lane need not wait.
    if [[ " $builds " == *" ompi41 "* ]]; then
      setup_ompi41
    fi
    second_lane_legs "$@"
    echo "=== the second lane's legs passed (at $((SECONDS / 60)) min $((SECONDS % 60)) s) ==="
  ) >"$SECOND_LANE_LOG" 2>&1 &
  second_lane_pid=$!
  # a run that fails in the first lane still shows what the second had done
  at_exit+=("kill_tree $second_lane_pid" "[ -n \"\${second_lane_shown:-}\" ] || { echo '=== the second lane, cut short: its output so far ==='; cat '$SECOND_LANE_LOG'; }; rm -f '$SECOND_LANE_LOG'")
  if [[ " $builds " == *" slurm "* ]]; then  # its cluster, should the run end inside a Slurm leg
    at_exit+=('"$ROOT/scripts/slurm_cluster.sh" down')
  fi
  # The MPI standard, not Open MPI's tolerance: MPICH rejects aliased buffers, and its Hydra
  # launcher takes other flags (tests/conftest.py picks them). The node algorithm runs in every
  # plain test here; of its shapes only the hierarchical 2 x 2 (the cross-node MPI calls). The
  # hang-prone jobs run under MPICH across the two hosts (above). Our algorithms (point-to-point
  # over MPI) each at 3 ranks, and the ring also at 2 (one peer on both sides): their other
  # rank counts change no MPI call's pattern, and the CPU leg runs them all. Not the
  # ecosystem libraries (Lightning, Accelerate: torch's API over the same collectives, run above).
  # Nor what is ours alone (the lanes are CPU-bound): the ops' jobs at one
  # rank (no message; the launcher's still runs), auto's choices other than at 3 ranks on one node
  # and across nodes (tables of ours; MPI only says who shares a node), the communicator counts
  # but past MPICH's cap, and the node algorithm across hosts as placed (one host here: what
  # every plain job runs; across hosts in the two-host and srun legs).
  run_suite "$MPICH_VENV" "MPICH build (Hydra mpiexec)" test_multirank.py test_reliability.py \
    test_flight_recorder.py -k "not soak and not count_above and not device_of_its_own and not prterun \
and not ecosystem \
and not (node_algorithm and not 2x2) and (not test_reliability or uncaught or async or clean or shared_mpi_thread \
or (leaving and (exit-in-collective-3 or send or host-destroys)) or staggered or never_waited or signal) \
and not (with_algorithm and (ring-5 or rhd-2 or allgather-2 or 4-ring or 4-rhd or 4-allgather or 2-rhd or 2-allgather)) \
and not node_across and not (hold_few and not past-the-cap) and not (auto_algorithm and not (3-env4 or 3-env5)) \
and not ((test_collectives or ddp_matches or fusion_one or random_ops_against or p2p_async_groups or bad_arguments) and [1])" "$@"
  cuda_leg "$@"
  doc_commands_step
  wait "$second_lane_pid" && second_lane_status=0 || second_lane_status=$?
  echo "=== the second lane's output (started beside the MPICH leg): ==="
  cat "$SECOND_LANE_LOG"
  second_lane_shown=1
  if [ "$second_lane_status" != 0 ]; then
    echo "=== the second lane FAILED (exit $second_lane_status) ===" >&2
    exit 1
  fi
else
  second_lane_legs "$@"
  cuda_leg "$@"
  doc_commands_step
fi
echo "=== every leg passed: $((SECONDS / 60)) min $((SECONDS % 60)) s ==="
