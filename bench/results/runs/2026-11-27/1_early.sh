#!/usr/bin/env bash
# Early 4-GPU call (landed main 801c3e9): issue 21's 4-rank proofs + the F32Accumulate hang diagnosis.
#   lane C: all multi-GPU suites (2- and 4-rank variants)          (all GPUs)
#   lane D: F32Accumulate bench diagnosis at 2 ranks, stacks on hang (GPUs 2,3)
# then, time allowing: fsdp bench at 4 ranks (bf16 + FSDP2 peer, MXFP8), dist at 4.
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"
say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"; command -v gdb cuda-gdb /usr/local/cuda/bin/cuda-gdb | tee -a "$L"
bash scripts/device_suite.sh build || { say "build failed"; tail -30 "$OUT/build.log"; exit 1; }
say "build done"
( timeout 430 meson test -C build-gpu --no-rebuild --print-errorlogs --suite gpu-multi --num-processes 1 \
    --timeout-multiplier 0.5 --logbase laneC >"$OUT/laneC.txt" 2>&1; echo "[$SECONDS s] lane C exit $?" >>"$OUT/laneC.txt" ) &
C=$!
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
GDB=$(command -v gdb || echo /usr/local/cuda/bin/cuda-gdb)
stuck() {  # $1 = name: dump every rank's stacks if the job still runs
  for p in $(pgrep -f "$1"); do
    echo "=== stacks of pid $p ($(tr '\0' ' ' </proc/$p/cmdline | cut -c1-120))"
    timeout 40 "$GDB" -p "$p" -batch -ex 'thread apply all bt 25' 2>&1 | grep -E '^(Thread|#)' | head -120
  done
}
diag() {  # $1 label, rest: the command
  local label=$1; shift
  ( CUDA_VISIBLE_DEVICES=2,3 NCCL_DEBUG=WARN timeout -s KILL 75 "$@" >"$OUT/d.tmp" 2>&1; echo "exit $?" >>"$OUT/d.tmp" ) &
  local pid=$! t=0
  while kill -0 $pid 2>/dev/null && [ $t -lt 45 ]; do sleep 1; t=$((t+1)); done
  if kill -0 $pid 2>/dev/null; then
    say "diag $label: still running after 45 s: stacks"; { echo "##### $label (hung)"; stuck "bench_(comm|dist_adam)"; } >>"$OUT/laneD.txt"
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv >>"$OUT/laneD.txt"
  fi
  wait $pid; say "diag $label: $(tail -1 "$OUT/d.tmp")"
  { echo "##### $label output"; cat "$OUT/d.tmp"; } >>"$OUT/laneD.txt"
}
diag "comm f32acc 1 MiB" $MPIRUN -n 2 build-gpu/bench/bench_comm --f32-accumulate --sizes-mib 1 --iters 2 --warmup 1
diag "comm f32acc 64 MiB" $MPIRUN -n 2 build-gpu/bench/bench_comm --f32-accumulate --sizes-mib 64 --iters 2 --warmup 1
diag "dist_adam grad-reduce-precision" $MPIRUN -n 2 build-gpu/bench/bench_dist_adam --grad-reduce-precision --iters 3
say "lane D done"
wait $C; say "lane C done: $(grep -E '^(Ok|Fail|Skipped|Timeout|Expected Fail|Unexpected Pass):' "$OUT/laneC.txt" | tr -s ' ' | tr '\n' ' ')"
grep -E 'FAIL|TIMEOUT' "$OUT/laneC.txt" | head -20 | tee -a "$L"
if [ $SECONDS -lt 470 ]; then
  FSDP_ONE=0 timeout $((570 - SECONDS)) bash scripts/device_suite.sh fsdp; say "fsdp 4 ranks done"
fi
grep -hE '^\{"bench"' "$OUT/summary.txt" 2>/dev/null | tail -20 >>"$L"
tar czf "$OUT/results.tgz" bench/results
say "all done"
