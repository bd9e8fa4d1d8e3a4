#!/bin/sh
# Runs a GPU test binary on N ranks, one GPU per rank; exits 77 (skipped) when the
# machine has fewer than N GPUs. NVLink multicast stays off (shared machines).
# Usage: run_mpi.sh MPIEXEC N BINARY [args...]
mpiexec="$1"; n="$2"; shift 2
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
# Only the GPUs this run may use count (a CUDA_VISIBLE_DEVICES lane of a larger machine).
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  visible=$(printf '%s\n' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
  [ "$visible" -lt "$gpus" ] && gpus=$visible
fi
if [ "$gpus" -lt "$n" ]; then
  echo "needs $n GPUs, found $gpus: skipping"
  exit 77
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda
exec "$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -n "$n" "$@"
