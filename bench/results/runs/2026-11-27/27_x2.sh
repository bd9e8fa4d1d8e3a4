#!/usr/bin/env bash
# Call 27 (2026-11-27, fourth session; nvidia-h100-x2, the last ~360 s of device time): the
# review mends and the dead-copy removal (main ec5172b) on a 2-GPU kind, not only on two
# GPUs of a 4-GPU one (call 25): the 2-rank suites that run DistributedAdam's MXFP8 step
# and the fused Adam + MXFP8 kernel, most telling first.
#   bash bench/results/runs/2026-11-27/27_x2.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || say "build phase exit $?"
say "build: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
timeout $((290 - SECONDS)) meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 1 --logbase x2 \
  gpu_mpi_mxfp8_params_n2 gpu_mpi_optimizer_sequence_n2 gpu_mpi_distributed_adam_n2 gpu_mpi_checkpoint_n2 \
  gpu_mpi_fsdp_mxfp8_n2 >"$OUT/tests.txt" 2>&1
say "2-rank MXFP8 suites exit $?"
sed "s/\x1b\[[0-9;]*m//g" "$OUT/tests.txt" | grep -E '^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):' | tee -a "$L"
rm -rf "$OUT/build"
