#!/usr/bin/env bash
# Call 26 (2026-11-27, fourth session; nvidia-h100-x1): issue 29's sanitize gate on an H100, on
# main 68e8324 (d1's in-place MXFP8 gather, the review mends and the dead-copy removal
# landed; call 25 ran the same gate green on an H200). As call 17's script:
#   bash bench/results/runs/2026-11-27/26_h100.sh
set -u; OUT="${OUT:-/tmp/o}"; L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; exit 1; }
say "build done: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
mkdir -p "$OUT/S"; SAN_JOBS=8 OUT="$OUT/S" timeout $((590 - SECONDS)) bash scripts/device_suite.sh sanitize >/dev/null 2>&1
say "sanitize exit $?"; grep -E "^(ok|FAIL)|sanitize:" "$OUT/S/summary.txt" | tee -a "$L"
cp "$OUT/S/summary.txt" "$OUT/sanitize_summary.txt"; rm -rf "$OUT/build" "$OUT/S"
