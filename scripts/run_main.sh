#!/usr/bin/env bash
# The README's main command: builds shardopt and its example trainer, then trains the
# trainer's MoE model on 2 ranks with mpiexec and shows the loss falling.
#   bash scripts/run_main.sh [extra trainer options]
# With 2 or more GPUs it runs one rank per GPU (--size small, CUDA + NCCL); otherwise on
# the host backend (--size tiny, MPI). Environment: BUILD_DIR (default build), CUDA_ARCH
# (default 90), STEPS (default 100).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
shardopt_deps
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
  args=(--size small --backend cuda)
else
  args=(--size tiny --backend host)
fi
exec mpiexec -n 2 --oversubscribe --bind-to none "$build/examples/trainer/trainer" "${args[@]}" \
  --steps "${STEPS:-100}" --log-every 10 "$@"
