#!/usr/bin/env bash
# The trainer recipes of docs/launchers.md, run at 2 ranks on the CPU: DeepSpeed ZeRO 1, 2 and 3
# (examples/deepspeed_zero.py; the group made first, and made by deepspeed.init_distributed) and
# the Hugging Face Trainer (examples/hf_trainer.py). Each example checks its parameters against
# single-process training and prints OK or WRONG. Installs deepspeed and transformers into the
# venv (default .venv, made by scripts/setup_env.sh), writes every run's output and a
# MANIFEST.json into a new folder of benchmarks/results/ and prints the summary. Not in CI:
# installing DeepSpeed (built from source) and the runs take longer than CI's budget leaves.
#   scripts/recipes.sh [VENV]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv}"
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# DeepSpeed's build imports torch: against this venv's, not a fresh one in an isolated build
"$PY" -m pip install -q transformers accelerate
"$PY" -m pip install -q --no-build-isolation deepspeed
cd "$ROOT"
out=$("$PY" -m torch_mpi_gpu.manifest new recipes)
failed=0
run() {  # name, example and its arguments
  local name=$1
  shift
  echo "=== $name ==="
  if "$PY" -m torch_mpi_gpu.mpirun -np 2 "$@" >"$out/$name.log" 2>&1; then :; else failed=1; fi
  grep -E "OK|WRONG" "$out/$name.log" || { failed=1; tail -20 "$out/$name.log"; }
}
for stage in 1 2 3; do
  run "deepspeed-zero$stage" examples/deepspeed_zero.py --stage "$stage"
  run "deepspeed-zero$stage-gloo" examples/deepspeed_zero.py --stage "$stage" --backend gloo
  run "deepspeed-zero$stage-init-deepspeed" examples/deepspeed_zero.py --stage "$stage" --init deepspeed
done
run hf-trainer examples/hf_trainer.py
versions=$("$PY" -c 'import deepspeed, transformers, accelerate
print(f"deepspeed {deepspeed.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}")' 2>/dev/null | tail -1)
grep -hE "OK|WRONG" "$out"/*.log >"$out/summary.txt"
"$PY" -m torch_mpi_gpu.manifest write "$out" --ranks 2 --command "scripts/recipes.sh" \
  --what "Trainer recipes at 2 ranks, CPU: DeepSpeed ZeRO 1-3 (group made first, and by deepspeed.init_distributed) and the Hugging Face Trainer, each against single-process training ($versions)"
echo "recipes: $([ $failed = 0 ] && echo all OK || echo FAILED) ($out)"
exit $failed
