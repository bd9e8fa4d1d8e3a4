#!/usr/bin/env bash
# Call 16 (nvidia-h100-x1), on 5e65c72 (the review mends f7a2a75 + the dependent-launch
# trigger moved first): two builds at once - build-gpu (this tree, warnings as errors) and
# /tmp/base (the same tree with bench/results/runs/2026-11-27/16_trigger.patch reversed: trigger after the wait, as
# on main), benches only; then bench_mxfp8 and bench_nvfp4 --only attn-k of both builds
# alternated twice (base, new, base, new) on the same GPU, the A/B of the trigger's place;
# then the single-GPU suites of the touched kernels.
#   bash bench/results/runs/2026-11-27/16_h100.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
rm -rf /tmp/base && mkdir /tmp/base && cp -r $(ls -A | grep -v '^build') /tmp/base/ && (cd /tmp/base && patch -R -p1 <bench/results/runs/2026-11-27/16_trigger.patch >/dev/null) || { say "base tree failed"; exit 1; }
( cd /tmp/base && meson setup build -Dcuda-arch=90 -Dbuildtype=release >/dev/null 2>&1 && ninja -C build bench/bench_mxfp8 bench/bench_nvfp4 >build.log 2>&1; echo "base build exit $?" >>"$L" ) &
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; grep -m3 -A8 error "$OUT/build/build.log" | tee -a "$L"; exit 1; }
say "build done: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
wait; say "base build finished"
mkdir -p "$OUT/base_results"
for round in 1 2; do
  for v in base new; do
    if [ $v = base ]; then B=/tmp/base/build; R="$OUT/base_results"; else B=build-gpu; R=bench/results; fi
    timeout 120 $B/bench/bench_mxfp8 --results "$R" >"$OUT/${v}_mx_$round.txt" 2>&1; e1=$?
    timeout 90 $B/bench/bench_nvfp4 --results "$R" --only attn-k >"$OUT/${v}_nv_$round.txt" 2>&1; e2=$?
    say "round $round $v: bench_mxfp8 exit $e1, bench_nvfp4 exit $e2"
    for f in "$OUT/${v}_mx_$round.txt" "$OUT/${v}_nv_$round.txt"; do
      grep -hE '^\{"bench"' "$f" | grep -E 'attn-k|attn-q|2d-weights' | grep -o '"config": "[^"]*"\|"device": "[^"]*"\|"ours_ms": [0-9.e-]*\|"floor_graph_ms": [0-9.e-]*\|"fraction_of_limit": [0-9.]*\|"no_pdl_ms": [0-9.e-]*' | paste -sd' ' | sed "s/\"config\"/\n  $v r$round:/g" >>"$L"
    done
  done
done
timeout 200 meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 2 gpu_nvfp4 gpu_mxfp8 gpu_mxfp8_batch \
  gpu_mxfp8_shard_batch gpu_piece_sum gpu_dependent_launch gpu_adam_mxfp8 gpu_adam gpu_mpi_kernel_preload_dist_adam_n1 \
  gpu_mpi_kernel_preload_fsdp_n1 >"$OUT/tests.txt" 2>&1
say "gpu tests exit $?"; grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):" "$OUT/tests.txt" | tee -a "$L"
tar czf "$OUT/results.tgz" bench/results "$OUT"/base_results "$OUT"/*.txt 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name lanes.log -exec rm -rf {} +
say "all done"
