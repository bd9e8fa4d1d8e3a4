#!/usr/bin/env bash
# Call 25 (2026-11-27, fourth session; nvidia-h100-x4 asked), on main + branch mends7 (the
# review mends of the in-place MXFP8 gather and the removal of the unused copy_row/copy_col
# of the fused Adam + MXFP8 pass, both structure only). Lanes on separate GPUs at once
# (CUDA_VISIBLE_DEVICES; each device_suite run has its own OUT):
#   PART=1: build, then
#     lane A (GPUs 0,1): the gpu-multi suite at 2 ranks (4-rank cases skip: 2 GPUs visible);
#     lane B (GPU 2):    the sanitize gate (memcheck of every single-GPU suite, which is also
#                        the gpu suite's proof; racecheck + synccheck of the kernel suites);
#     lane C (GPU 3):    bench_dist_adam at 1 rank (MXFP8 / NVFP4 steps against bf16).
#   PART=2: bench_dist_adam at 2 ranks (GPUs 0,1; call 22: MXFP8 step 1.066x of bf16), the
#     gpu-multi suite's 4-rank cases on all four GPUs, bench_dist_adam at 4 ranks.
#   PART=1 bash bench/results/runs/2026-11-27/25_x4.sh ; PART=2 bash ...
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
lane() {  # name, gpus, time limit, phases... (device_suite with its own OUT)
  local name="$1" gpus="$2" limit="$3"; shift 3
  mkdir -p "$OUT/$name"
  CUDA_VISIBLE_DEVICES="$gpus" OUT="$OUT/$name" timeout "$limit" bash scripts/device_suite.sh "$@" >/dev/null 2>&1
  say "lane $name ($gpus: $*) exit $?"
}
bench() {  # name, gpus, ranks
  CUDA_VISIBLE_DEVICES="$2" timeout 140 mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$3" \
    build-gpu/bench/bench_dist_adam --results "$OUT/r_$1" >"$OUT/bench_$1.txt" 2>&1
  say "bench_dist_adam $1 ($3 ranks) exit $?"
  grep -hE '^\{"bench": "dist_adam_(step|iteration)"' "$OUT/bench_$1.txt" | grep -o '"config": "[^"]*"\|"ours_ms": [0-9.e-]*\|"[a-z_]*over_bf16[a-z_]*": [0-9.]*' | paste -sd' ' | sed 's/"config"/\n  '"$1"':/g' >>"$L"; echo >>"$L"
}
nvidia-smi -L | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || say "build phase exit $?"
say "build: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
if [ "${PART:-1}" = 1 ]; then
  lane A 0,1 $((585 - SECONDS)) testsN &
  SAN_JOBS=8 lane B 2 $((585 - SECONDS)) sanitize &
  bench n1 3 1 &
  wait
  sed 's/\x1b\[[0-9;]*m//g' build-gpu/meson-logs/testlog.txt 2>/dev/null | grep -E '^ *[0-9]+/[0-9]+ ' >"$OUT/multi_list.txt"
else
  names=$(meson test -C build-gpu --list --suite gpu-multi 2>/dev/null | sed 's/.*shardopt:\(\S*\).*/\1/;s/.*://' | grep '_n4$')
  say "4-rank cases: $(echo $names | wc -w)"
  bench n2 0,1 2
  timeout $((440 - SECONDS)) meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 1 --logbase n4 $names \
    >"$OUT/n4_tests.txt" 2>&1
  say "4-rank cases exit $?"
  sed 's/\x1b\[[0-9;]*m//g' build-gpu/meson-logs/n4.txt | grep -E '^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):' | tee -a "$L"
  bench n4 0,1,2,3 4
fi
for d in "$OUT"/*/; do
  [ -f "$d/summary.txt" ] || continue
  { echo "=== $(basename "$d")"; grep -vhE '^\{"bench"' "$d/summary.txt" | grep -E "FAIL|TIMEOUT|gpu tests|sanitize|memcheck|racecheck|synccheck|exit|failed|build|PASS" | head -80; } >>"$L"
done
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls -d */ *.txt r_* 2>/dev/null) 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name logs.tgz ! -name lanes.log ! -name multi_list.txt -exec rm -rf {} +
say "all done"
