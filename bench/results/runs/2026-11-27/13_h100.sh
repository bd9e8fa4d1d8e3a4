#!/usr/bin/env bash
# Call 13 (nvidia-h100-x1), on the merged tree: the sanitize gate of issue 29 on an H100
# (memcheck of every single-GPU suite, which is also the gpu suite's proof; racecheck and
# synccheck of the kernel suites), then the one-GPU benches alone on the GPU: bench_mxfp8 and
# bench_nvfp4 (the small calls with dependent launches on and off) and the one-rank step phases.
#   bash bench/results/runs/2026-11-27/13_h100.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"; git log --oneline -1 2>/dev/null | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; grep -B2 -A8 -m3 "error" "$OUT/build/build.log" | tee -a "$L"; exit 1; }
say "build done: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
mkdir -p "$OUT/S"; SAN_JOBS=8 OUT="$OUT/S" timeout 420 bash scripts/device_suite.sh sanitize >/dev/null 2>&1
say "sanitize exit $?"; grep -E "^(ok|FAIL)|sanitize:" "$OUT/S/summary.txt" | tee -a "$L"
rem=$((575 - SECONDS))
if [ "$rem" -gt 40 ]; then mkdir -p "$OUT/B"; PHASE_RANKS=1 OUT="$OUT/B" timeout "$rem" bash scripts/device_suite.sh mxfp8 nvfp4 phases >/dev/null 2>&1
  say "one-GPU benches exit $?"; grep -hE '^\{"bench"' "$OUT/B/summary.txt" | cut -c1-600 >>"$L"; fi
tar czf "$OUT/results.tgz" bench/results "$OUT"/*/*.log "$OUT"/*/*.txt 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name lanes.log -exec rm -rf {} +
say "all done"
