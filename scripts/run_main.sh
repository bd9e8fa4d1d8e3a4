#!/usr/bin/env bash
# The README's main command: builds shardopt and its example trainer, trains the trainer's
# MoE model with mpiexec and shows the loss falling, then shows a checkpoint resume: the
# run saves at its halfway step and at its last step, and a second mpiexec (new
# processes) resumes from the halfway checkpoint and trains to the same last step, ending
# with exactly the same final loss. It ends by drawing both runs' loss curves, one over
# the other, into a PNG (matplotlib) and prints its path.
#   bash scripts/run_main.sh [extra trainer options, given to both runs]
# Where it runs: with 2 or more GPUs 2 ranks, one per GPU (--size small, CUDA + NCCL);
# with exactly one GPU 1 rank on it (--size small, CUDA); without a GPU 2 ranks on the
# host backend (--size tiny, MPI). Environment: BUILD_DIR (default build), CUDA_ARCH
# (default 90), STEPS (default 100; checkpoints at STEPS/2 and STEPS), PLOT (the PNG;
# default $BUILD_DIR/run_main_loss.png).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
shardopt_deps
shardopt_plot_deps
build="${BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dcuda-arch="${CUDA_ARCH:-90}"
fi
ninja -C "$build" examples/trainer/trainer
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [ "$gpus" -ge 2 ]; then
  export NCCL_NVLS_ENABLE=0
  ranks=2
  args=(--size small --backend cuda)
elif [ "$gpus" -eq 1 ]; then
  ranks=1
  args=(--size small --backend cuda)
else
  ranks=2
  args=(--size tiny --backend host)
fi
steps="${STEPS:-100}"
half=$((steps / 2))
ckpt=$(mktemp -d "${TMPDIR:-/tmp}/shardopt-main-XXXXXX")
trap 'rm -rf "$ckpt"' EXIT
train() {
  mpiexec -n "$ranks" --oversubscribe --bind-to none "$build/examples/trainer/trainer" "${args[@]}" \
    --steps "$steps" --log-every 10 "$@"
}

if [ "$half" -lt 1 ]; then  # too short to resume halfway: train only
  train "$@"
  exit 0
fi
echo "== run 1: $steps steps, saving checkpoints after steps $half and $steps into $ckpt"
train --save-dir "$ckpt" --save-every "$half" --metrics "$ckpt/run1.jsonl" "$@" | tee "$ckpt/run1.log"
resume_from="$ckpt/$(printf 'step-%05d' "$half")"
echo
echo "== run 2: new processes resume from $resume_from and train to step $steps"
train --resume "$resume_from" --metrics "$ckpt/run2.jsonl" "$@" | tee "$ckpt/run2.log"
first=$(grep '^final loss ' "$ckpt/run1.log" || true)
second=$(grep '^final loss ' "$ckpt/run2.log" || true)
echo
plot="${PLOT:-$build/run_main_loss.png}"
echo "loss curves (run 1, and run 2 resumed at step $half): $(python3 scripts/plot_loss.py "$plot" \
  "run 1 ($steps steps)=$ckpt/run1.jsonl" "run 2 (resumed at step $half)=$ckpt/run2.jsonl")"
if [ -n "$first" ] && [ "$first" = "$second" ]; then
  echo "resume check: the resumed run ends exactly like the uninterrupted one ($first)"
else
  echo "resume check FAILED: uninterrupted '$first', resumed '$second'" >&2
  exit 1
fi
