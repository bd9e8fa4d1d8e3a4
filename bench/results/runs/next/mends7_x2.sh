#!/usr/bin/env bash
# Prepared 2026-11-27 (third session) on branch mends7: the review mends of the in-place MXFP8
# gather (structure only) proven before they land: the gpu-multi suite at 2 ranks, then
# bench_dist_adam at 2 ranks (the MXFP8 step was 1.066x of bf16 in call 22: it must not move).
# Two GPUs (nvidia-h100-x2); tree = branch mends7. Rename to runs/<date>/NN_x2.sh when it runs.
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash scripts/device_suite.sh build testsN >/dev/null 2>&1; echo "build + testsN exit $?" | tee "$OUT/lanes.log"
grep -h 'build ok\|BUILD\|gpu tests\|FAIL\|TIMEOUT' "$OUT/summary.txt" | tee -a "$OUT/lanes.log"
timeout 150 mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 build-gpu/bench/bench_dist_adam \
  --results "$OUT/r" >"$OUT/bench.txt" 2>&1; echo "bench_dist_adam n2 exit $?" | tee -a "$OUT/lanes.log"
grep -hE '^\{"bench": "dist_adam_iteration"' "$OUT/bench.txt" | grep -o '"config": "[^"]*"\|"[a-z_]*over_bf16[a-z_]*": [0-9.]*' | tee -a "$OUT/lanes.log"
