set -u; OUT="${OUT:-/tmp/o}"; L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; exit 1; }
say "build done: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
mkdir -p "$OUT/S"; SAN_JOBS=8 OUT="$OUT/S" timeout $((585 - SECONDS)) bash scripts/device_suite.sh sanitize >/dev/null 2>&1
say "sanitize exit $?"; grep -E "^(ok|FAIL)|sanitize:" "$OUT/S/summary.txt" | tee -a "$L"
cp "$OUT/S/summary.txt" "$OUT/sanitize_summary.txt"; rm -rf "$OUT/build" "$OUT/S"
