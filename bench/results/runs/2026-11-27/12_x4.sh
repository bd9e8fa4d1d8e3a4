#!/usr/bin/env bash
# Call 12 (nvidia-h200-x4 / nvidia-h100-x4), on the merged tree of this session (b1-b4). Lanes on
# separate GPUs at once (CUDA_VISIBLE_DEVICES; each device_suite run has its own OUT and scratch):
#   lane A (GPUs 0,1): the gpu-multi suite at 2 ranks;
#   lane B (GPUs 2,3): issue 31 on the topology where call 10 hung: bench_comm --f32-accumulate (the new
#                      sum kernel's rows), then bench_dist_adam --grad-reduce-precision with NCCL
#                      registration on (stacks if it hangs past 120 s) and off; then the two-rank phases
#                      (MXFP8 / NVFP4 / bf16 steps and iterations);
#   then, alone on the machine: bench_trace with the NVTX ranges compiled in and out (issue 32), the
#   README main command with --optimizer muon at 2 ranks (issue 34: the loss falls), bench_muon at 2 ranks.
#   bash bench/results/runs/2026-11-27/12_x4.sh    (carry: .dev_data, .whl)
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
lane() {  # name, gpus, time limit, phases... (device_suite with its own OUT)
  local name="$1" gpus="$2" limit="$3"; shift 3
  mkdir -p "$OUT/$name"
  CUDA_VISIBLE_DEVICES="$gpus" OUT="$OUT/$name" timeout "$limit" bash scripts/device_suite.sh "$@" >/dev/null 2>&1
  say "lane $name ($gpus: $*) exit $?"
}
# watched LIMIT NAME BIN CMD...: CMD (an mpirun job of BIN) in the background; past LIMIT s, the main
# threads' stacks of its rank processes (cuda-gdb) go to $OUT/NAME.hang, then it is killed.
watched() {
  local limit="$1" name="$2" bin="$3"; shift 3
  "$@" >"$OUT/$name.txt" 2>&1 &
  local job=$! w=0
  while kill -0 "$job" 2>/dev/null && [ "$w" -lt "$limit" ]; do sleep 1; w=$((w + 1)); done
  if ! kill -0 "$job" 2>/dev/null; then wait "$job"; say "$name exit $? ($w s)"; return; fi
  for p in $(pgrep -f "$bin" | grep -v "^$job$"); do
    [ "$(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | head -1)" = "$bin" ] || continue
    { echo "-- $p"; timeout 40 /usr/local/cuda/bin/cuda-gdb -p "$p" -batch -ex 'thread apply all bt' 2>&1 |
        grep -E '^(Thread 1 |#)' | grep -A30 '^Thread 1 ' | head -30; } >>"$OUT/$name.hang"
  done
  pkill -KILL -f "$bin"; kill -KILL "$job" 2>/dev/null; wait "$job" 2>/dev/null
  say "$name HUNG after $limit s (stacks in $name.hang)"
}
nvidia-smi -L | tee -a "$L"; git log --oneline -1 2>/dev/null | tee -a "$L"
python3 -c 'import matplotlib' 2>/dev/null || { python3 -m pip install -q --no-index --find-links .whl/mpl matplotlib 2>&1 ||
  python3 -m pip install -q --break-system-packages --no-index --find-links .whl/mpl matplotlib; } 2>&1 | tail -2 | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; grep -B2 -A8 -m3 "error" "$OUT/build/build.log" | tee -a "$L"; }
say "build done: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
( meson setup build-nonvtx -Dcuda-arch=90 -Dbuildtype=release -Dnvtx=disabled -Dtests=false -Dexamples=false &&
  ninja -C build-nonvtx bench/bench_trace ) >"$OUT/nonvtx_build.txt" 2>&1 &
NV=$!
lane A 0,1 400 testsN &
(
  export CUDA_VISIBLE_DEVICES=2,3 NCCL_DEBUG=WARN
  timeout 150 $MPIRUN -n 2 build-gpu/bench/bench_comm --f32-accumulate --sizes-mib 64,256,1024 --iters 20 \
    --wait-timeout-s 60 --results bench/results >"$OUT/comm_f32acc.txt" 2>&1
  say "bench_comm --f32-accumulate exit $?"; grep -E '^\{"bench"' "$OUT/comm_f32acc.txt" | cut -c1-500 >>"$L"
  watched 120 dist build-gpu/bench/bench_dist_adam $MPIRUN -n 2 build-gpu/bench/bench_dist_adam --grad-reduce-precision --results bench/results
  grep -E '^\{"bench"' "$OUT/dist.txt" | cut -c1-400 >>"$L"
  if [ -f "$OUT/dist.hang" ]; then
    NCCL_LOCAL_REGISTER=0 watched 100 dist_noreg build-gpu/bench/bench_dist_adam $MPIRUN -x NCCL_LOCAL_REGISTER -n 2 \
      build-gpu/bench/bench_dist_adam --grad-reduce-precision --results bench/results
    grep -E '^\{"bench"' "$OUT/dist_noreg.txt" | cut -c1-400 >>"$L"
  fi
  unset NCCL_DEBUG
  timeout 200 $MPIRUN -n 2 build-gpu/bench/bench_dist_adam --phases --results bench/results >"$OUT/phases2.txt" 2>&1
  say "phases at 2 ranks exit $?"; grep -E '^\{"bench"' "$OUT/phases2.txt" | cut -c1-700 >>"$L"
) &
wait
say "lanes done"
wait $NV; say "nonvtx build exit $?"
for i in 1 2 3; do
  CUDA_VISIBLE_DEVICES=0 build-gpu/bench/bench_trace --results bench/results; CUDA_VISIBLE_DEVICES=0 build-nonvtx/bench/bench_trace --results bench/results
done >"$OUT/trace.txt" 2>&1
say "bench_trace with and without NVTX (alone on the machine, 3 rounds)"; grep -E '^\{"bench"' "$OUT/trace.txt" | cut -c1-400 >>"$L"
CUDA_VISIBLE_DEVICES=0,1 PLOT="$OUT/run_main_muon_loss.png" DATA=.dev_data/shakespeare BUILD_DIR=build-gpu \
  timeout 150 bash scripts/run_main.sh --optimizer muon >"$OUT/main_muon.txt" 2>&1
say "run_main --optimizer muon exit $?"; grep -E "val|resume|png|step +1000|final" "$OUT/main_muon.txt" | tail -12 | tee -a "$L"
rem=$((570 - SECONDS)); [ "$rem" -gt 60 ] && lane M 0,1 "$rem" muon
for d in "$OUT"/*/; do
  [ -f "$d/summary.txt" ] || continue
  { echo "=== $(basename "$d")"; grep -vhE '^\{"bench"' "$d/summary.txt" | grep -E "FAIL|TIMEOUT|gpu tests|exit|failed|build|PASS|muon" | head -40; } >>"$L"
  grep -hE '^\{"bench"' "$d/summary.txt" | cut -c1-600 >>"$L"
done
tar czf "$OUT/results.tgz" bench/results "$OUT"/*/*.log "$OUT"/*/*.txt "$OUT"/*.txt "$OUT"/*.hang 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name lanes.log ! -name '*.png' -exec rm -rf {} +
say "all done"
