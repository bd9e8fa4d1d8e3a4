#!/usr/bin/env bash
# The GPU machine's one script: builds shardopt, runs the GPU test suites and the
# benchmarks (with their PyTorch peers in the same job), and writes a few files under
# $OUT (the device tool brings back at most 8):
#   summary.txt   pass/fail lines and every benchmark JSON line
#   build.log     meson + ninja
#   tests.log     meson test output of the GPU suites
#   bench.log     benchmark and peer output
#   results.tgz   bench/results/*.jsonl after the run
#
#   bash scripts/device_suite.sh [phase ...]
# Phases (default: all that the machine's GPU count allows):
#   build         configure and build (build-gpu/, sm_90)
#   tests1        single-GPU suites (+ one-rank MPI suites)
#   testsN        multi-GPU suites (mpirun, one rank per GPU)
#   adam          bench_adam + PyTorch peer + the 100-step torch comparison
#   mxfp8         bench_mxfp8
#   comm          bench_comm (all GPUs)
#   dist          bench_dist_adam + peer (all GPUs, and 2)
#   hostcpu       bench_dist_adam --host-cpu-only (all GPUs, 2, 1): host CPU per step
#   fsdp          bench_fsdp + peer (all GPUs)
#   trainer       trainer benchmark (all GPUs)
#   main          the README's main command (trainer on 2 GPUs)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/shardopt-out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
BUILD=build-gpu
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
SUMMARY="$OUT/summary.txt"
log() { echo "$*" | tee -a "$SUMMARY"; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
TORCHRUN="python3 -m torch.distributed.run --standalone"

phase_build() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nvcc --version | tail -1;
    meson --version; mpirun --version 2>&1 | head -1; python3 -c 'import torch; print("torch", torch.__version__)'; } 2>&1 | tee -a "$SUMMARY"
  log "== build ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $GPUS GPUs)"
  { [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" -Dcuda-arch=90 -Dbuildtype=release; } >>"$OUT/build.log" 2>&1
  if ninja -C "$BUILD" >>"$OUT/build.log" 2>&1; then log "build ok"; else log "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; fi
}

run_suite() {  # name, meson test args...
  local name="$1"; shift
  local t0=$SECONDS
  meson test -C "$BUILD" --no-rebuild --print-errorlogs "$@" >>"$OUT/tests.log" 2>&1
  log "$name: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$BUILD/meson-logs/testlog.txt" | tr -s ' ' | tr '\n' ' ') ($((SECONDS - t0)) s)"
  grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT)' "$BUILD/meson-logs/testlog.txt" | tee -a "$SUMMARY" || true
}

phase_tests1() {
  run_suite "gpu tests (1 GPU)" --suite gpu --num-processes 1 --timeout-multiplier 0.25
}

phase_testsN() {
  run_suite "gpu tests (multi-GPU)" --suite gpu-multi --num-processes 1 --timeout-multiplier 0.25
}

bench_line() { grep -hE '^\{"bench"' "$@" | tee -a "$SUMMARY"; }

phase_adam() {
  log "== adam"
  python3 bench/peers/adam_peer.py --out /tmp/peer_adam.json >>"$OUT/bench.log" 2>&1 || log "adam peer failed"
  "$BUILD/bench/bench_adam" --peer-json /tmp/peer_adam.json --results bench/results >/tmp/b.log 2>&1
  cat /tmp/b.log >>"$OUT/bench.log"; bench_line /tmp/b.log
  mkdir -p /tmp/adam_check
  "$BUILD/bench/bench_adam" --torch-check-dir /tmp/adam_check >>"$OUT/bench.log" 2>&1 &&
    python3 bench/peers/adam_torch_check.py --dir /tmp/adam_check 2>&1 | tee -a "$OUT/bench.log" | grep -E "PASS|FAIL" | tee -a "$SUMMARY"
}

phase_mxfp8() {
  log "== mxfp8"
  timeout 180 "$BUILD/bench/bench_mxfp8" --results bench/results >/tmp/b.log 2>&1; cat /tmp/b.log >>"$OUT/bench.log"; bench_line /tmp/b.log
}

phase_comm() {
  log "== comm ($GPUS ranks)"
  $MPIRUN -n "$GPUS" "$BUILD/bench/bench_comm" --results bench/results >/tmp/b.log 2>&1; cat /tmp/b.log >>"$OUT/bench.log"; bench_line /tmp/b.log
}

phase_dist() {
  for n in "$GPUS" 2 1; do
    [ "$n" -le "$GPUS" ] || continue
    log "== dist-adam ($n ranks)"
    timeout 150 $TORCHRUN --nproc_per_node "$n" bench/peers/dist_adam_peer.py --out /tmp/peer_dist.tsv >>"$OUT/bench.log" 2>&1 || log "dist peer failed"
    timeout 150 $MPIRUN -n "$n" "$BUILD/bench/bench_dist_adam" --peer /tmp/peer_dist.tsv --results bench/results >/tmp/b.log 2>&1
    cat /tmp/b.log >>"$OUT/bench.log"; bench_line /tmp/b.log
  done
}

phase_hostcpu() {
  for n in "$GPUS" 2 1; do
    [ "$n" -le "$GPUS" ] || continue
    for mixing in default 0; do  # NCCL's graph-mixing support adds event nodes per NCCL launch
      [ "$n" -gt 1 ] || [ "$mixing" = default ] || continue
      log "== host CPU per step ($n ranks, NCCL_GRAPH_MIXING_SUPPORT $mixing)"
      if [ "$mixing" = 0 ]; then env=(NCCL_GRAPH_MIXING_SUPPORT=0); else env=(); fi
      timeout 120 env "${env[@]}" $MPIRUN -n "$n" "$BUILD/bench/bench_dist_adam" --host-cpu-only --results bench/results >/tmp/b.log 2>&1
      cat /tmp/b.log >>"$OUT/bench.log"; bench_line /tmp/b.log
    done
  done
}

phase_fsdp() {
  [ -x "$BUILD/bench/bench_fsdp" ] || return 0
  log "== fsdp ($GPUS ranks)"
  timeout 150 $TORCHRUN --nproc_per_node "$GPUS" bench/peers/fsdp_peer.py --out /tmp/peer_fsdp.tsv >>"$OUT/bench.log" 2>&1 || log "fsdp peer failed"
  timeout 150 $MPIRUN -n "$GPUS" "$BUILD/bench/bench_fsdp" --peer /tmp/peer_fsdp.tsv --results bench/results >/tmp/b.log 2>&1
  cat /tmp/b.log >>"$OUT/bench.log"; bench_line /tmp/b.log
}

phase_trainer() {
  [ -x "$BUILD/examples/trainer/bench_trainer" ] || return 0
  log "== trainer ($GPUS ranks)"
  timeout 240 $MPIRUN -n "$GPUS" "$BUILD/examples/trainer/bench_trainer" --results bench/results >/tmp/b.log 2>&1
  timeout 240 $MPIRUN -n "$GPUS" "$BUILD/examples/trainer/bench_trainer" --params mxfp8 --graphs on --results bench/results >>/tmp/b.log 2>&1
  cat /tmp/b.log >>"$OUT/bench.log"; bench_line /tmp/b.log
}

phase_main() {
  log "== README main command on GPUs (2 ranks)"
  BUILD_DIR="$BUILD" timeout 120 bash scripts/run_main.sh >/tmp/b.log 2>&1
  cat /tmp/b.log >>"$OUT/bench.log"; grep -E "step|loss" /tmp/b.log | tail -4 | tee -a "$SUMMARY"
}

phases=("$@")
if [ ${#phases[@]} -eq 0 ]; then
  phases=(build tests1 adam mxfp8)
  [ "$GPUS" -ge 2 ] && phases+=(testsN comm dist fsdp trainer)
fi
: >"$SUMMARY"
for p in "${phases[@]}"; do "phase_$p"; done
tar czf "$OUT/results.tgz" bench/results 2>/dev/null
log "done in ${SECONDS}s"
