#!/usr/bin/env bash
# Call 14 (nvidia-h100-x4), on c84ef4e: the gpu-multi suite's 4-rank cases (call 12 ran its 2-rank
# cases on 2 of 4 GPUs, where the 4-rank cases skip).
#   bash bench/results/runs/2026-11-27/14_x4.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; exit 1; }
say "build done: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
names=$(meson test -C build-gpu --list --suite gpu-multi 2>/dev/null | awk '{print $NF}' | sed 's/^shardopt://' | grep -E '_n4($|_)')
say "4-rank cases: $(echo $names | wc -w)"
timeout $((560 - SECONDS)) meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 1 --timeout-multiplier 0.25 $names >"$OUT/tests_n4.txt" 2>&1
say "exit $?"; grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):" "$OUT/tests_n4.txt" | tee -a "$L"
grep -B5 -A30 "FAIL\|TIMEOUT" "$OUT/tests_n4.txt" | head -120 > "$OUT/failures.txt"
rm -rf "$OUT/build"
