#!/usr/bin/env bash
# Call 18 (2 GPUs), on the merged tree with helper c1's pipelined tail: two builds at once -
# build-gpu (this tree, warnings as errors) and /tmp/var (the same tree with 18_nocopy.patch:
# the fused MXFP8 pass no longer writes the owned tile rows into the storage, the landing
# copies every byte as before b3), bench_dist_adam only; then `bench_dist_adam --phases` at
# 2 ranks of both builds, and of this build with --gather-pipeline 8, alternated twice
# (main, nocopy, gp8, main, nocopy, gp8): step, iteration and phase rows, each format against
# bf16 in the same process (gp8 in the first round only); then the gpu-multi suite at 2 ranks
# and, beside it on GPU 0, the single-GPU suite (every step now runs its tail on side streams).
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
    [ $v = gp8 ] && [ $round = 2 ] && continue
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
# The two suites at once, each with its own meson log (--logbase), as device_suite.sh's
# tests1 / testsN phases run them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
( timeout $((585 - SECONDS)) meson test -C build-gpu --no-rebuild --print-errorlogs --suite gpu-multi --num-processes 1 \
    --timeout-multiplier 0.5 --logbase multi >"$OUT/tests_multi.txt" 2>&1; echo "[$SECONDS s] gpu-multi at 2 ranks exit $?" >>"$L" ) &
( CUDA_VISIBLE_DEVICES=0 timeout $((585 - SECONDS)) meson test -C build-gpu --no-rebuild --print-errorlogs --suite gpu \
    --num-processes 1 --timeout-multiplier 0.5 --logbase single >"$OUT/tests_single.txt" 2>&1; echo "[$SECONDS s] gpu (1 GPU) exit $?" >>"$L" ) &
wait
for f in multi single; do
  echo "== $f: $(grep -E '^(Ok|Fail|Skipped|Timeout):' build-gpu/meson-logs/$f.txt | tr -s ' ' | tr '\n' ' ')" | tee -a "$L"
  grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT)' build-gpu/meson-logs/$f.txt | tee -a "$L"
  cp build-gpu/meson-logs/$f.txt "$OUT/testlog_$f.txt"
done
tar czf "$OUT/results.tgz" bench/results "$OUT"/var_results "$OUT"/gp8_results "$OUT"/*.txt 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name lanes.log -exec rm -rf {} +
say "all done"
