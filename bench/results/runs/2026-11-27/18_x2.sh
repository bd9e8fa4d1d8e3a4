#!/usr/bin/env bash
# Call 18 (2 GPUs), on the merged tree with helper c1's pipelined tail: two builds at once -
# build-gpu (this tree, warnings as errors) and /tmp/var (the same tree with 18_nocopy.patch:
# the fused MXFP8 pass no longer writes the owned tile rows into the storage, the landing
# copies every byte as before b3), bench_dist_adam only; then `bench_dist_adam --phases` at
# 2 ranks of both builds, and of this build with --gather-pipeline 8, alternated twice
# (main, nocopy, gp8, main, nocopy, gp8): step, iteration and phase rows, each format against
# bf16 in the same process; then the gpu-multi suite at 2 ranks.
#   bash bench/results/runs/2026-11-27/18_x2.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
nvidia-smi -L | tee -a "$L"
rm -rf /tmp/var && mkdir /tmp/var && cp -r $(ls -A | grep -v '^build') /tmp/var/ &&
  (cd /tmp/var && patch -p1 <bench/results/runs/2026-11-27/18_nocopy.patch >/dev/null) || { say "variant tree failed"; exit 1; }
( cd /tmp/var && meson setup build -Dcuda-arch=90 -Dbuildtype=release >/dev/null 2>&1 &&
  ninja -C build bench/bench_dist_adam >build.log 2>&1; echo "variant build exit $?" >>"$L" ) &
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; grep -m3 -A8 error "$OUT/build/build.log" | tee -a "$L"; exit 1; }
say "build done: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
wait; say "variant build finished"
mkdir -p "$OUT/var_results" "$OUT/gp8_results"
for round in 1 2; do
  for v in main nocopy gp8; do
    X=()
    case $v in
      main) B=build-gpu; R=bench/results ;;
      nocopy) B=/tmp/var/build; R="$OUT/var_results" ;;
      gp8) B=build-gpu; R="$OUT/gp8_results"; X=(--gather-pipeline 8) ;;
    esac
    timeout 120 $MPIRUN -n 2 $B/bench/bench_dist_adam --phases --results "$R" "${X[@]}" >"$OUT/${v}_$round.txt" 2>&1
    say "round $round $v: exit $?"
    grep -hE '^\{"bench": "dist_adam_(step|iteration)"' "$OUT/${v}_$round.txt" | grep -o '"config": "[^"]*"\|"device": "[^"]*"\|"ours_ms": [0-9.e-]*\|"[a-z_]*over_bf16[a-z_]*": [0-9.]*' | paste -sd' ' | sed "s/\"config\"/\n  $v r$round:/g" >>"$L"
    grep -hE '^\{"bench": "dist_adam_phases"' "$OUT/${v}_$round.txt" | grep mxfp8 | cut -c1-900 >>"$L"
  done
done
mkdir -p "$OUT/T"; OUT="$OUT/T" timeout $((590 - SECONDS)) bash scripts/device_suite.sh testsN >/dev/null 2>&1
say "gpu-multi at 2 ranks exit $?"; grep -E "gpu tests|FAIL|TIMEOUT" "$OUT/T/summary.txt" | tee -a "$L"
tar czf "$OUT/results.tgz" bench/results "$OUT"/var_results "$OUT"/gp8_results "$OUT"/*.txt "$OUT"/T/*.log 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name lanes.log -exec rm -rf {} +
say "all done"
