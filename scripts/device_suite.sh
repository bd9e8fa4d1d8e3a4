#!/usr/bin/env bash
# The GPU machine's one script: builds shardopt, runs the GPU test suites and the
# benchmarks (with their PyTorch peers in the same job), and writes a few files under
# $OUT (the device tool brings back at most 8):
#   summary.txt   pass/fail lines and every benchmark JSON line
#   build.log     meson + ninja
#   tests.log     meson test output of the GPU suites
#   bench.log     benchmark and peer output
#   sanitize.log  compute-sanitizer output (sanitize phase)
#   results.tgz   bench/results/*.jsonl after the run
#
#   bash scripts/device_suite.sh [phase ...]
# Phases (default: all that the machine's GPU count allows):
#   build         configure and build (build-gpu/, sm_90, warnings are errors: see phase_build)
#   tests1        single-GPU suites (+ one-rank MPI suites)
#   testsN        multi-GPU suites (mpirun, one rank per GPU)
#   adam          bench_adam + PyTorch peer + the 100-step torch comparison
#   mxfp8         bench_mxfp8
#   nvfp4         bench_nvfp4 (NVFP4 quantize: whole tensor, batches, sharded)
#   comm          bench_comm (all GPUs)
#   reduce        GradReducePrecision::F32Accumulate (issue 31): bench_comm --f32-accumulate
#                 (2 GPUs, and all when more) and bench_dist_adam --grad-reduce-precision
#   dist          bench_dist_adam + peer (all GPUs, and 2)
#   phases        bench_dist_adam --phases (1 and 2 ranks): step rows + where each format's
#                 step time goes (dist_adam_phases rows)
#   hostcpu       bench_dist_adam --host-cpu-only (all GPUs, 2, 1): host CPU per step
#   fsdp          bench_fsdp bf16 (+ FSDP2 peer, + Megatron-FSDP peer when megatron_fsdp imports)
#                 and --params mxfp8 (all GPUs, 2, then 1)
#   trainer       trainer benchmark (all GPUs)
#   checkpoint    bench_checkpoint: save / load / save_async stall, one rank (CKPT_REPS, default 3)
#   muon          bench_muon (issue 34) at 1, 2 and all GPUs, each after its peer (muon_peer.py:
#                 torch.optim.Muon on 1 GPU, a torch gather-orthogonalize-scatter peer at 2+)
#   main          the README's main command (trainer on 2 GPUs)
#   sanitize      compute-sanitizer (needs build; ~6 min on one H100): memcheck on every
#                 single-GPU suite (and, with 2+ GPUs, one 2-rank suite under mpirun),
#                 racecheck + synccheck on the suites that launch the kernels with shared
#                 memory, barriers or warp shuffles; full output in sanitize.log, one line
#                 per run in summary.txt; the script exits non-zero when any run fails.
#                 SAN_JOBS runs at a time (default 6), longest expected first, each with a
#                 limit from its own expected time (see "The gate's scheduling" below).
#                 SAN_ONLY=REGEX keeps the runs of the suites whose names match (a partial
#                 check: the gate is the phase without it)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/shardopt-out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
BUILD=build-gpu
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then GPUS=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .); fi  # those this run may use
SUMMARY="$OUT/summary.txt"
log() { echo "$*" | tee -a "$SUMMARY"; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
# Scratch files of this run (logs, peers' timings): its own folder, so that runs on
# separate GPUs of one machine (CUDA_VISIBLE_DEVICES lanes) do not share them.
T=$(mktemp -d "${TMPDIR:-/tmp}/shardopt-suite-XXXXXX")
TORCHRUN="python3 -m torch.distributed.run --standalone"

phase_build() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nvcc --version | tail -1;
    meson --version; mpirun --version 2>&1 | head -1; python3 -c 'import torch; print("torch", torch.__version__)'; } 2>&1 | tee -a "$SUMMARY"
  log "== build ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $GPUS GPUs)"
  # Warnings are errors, as in CI's build: -Dwerror=true gives the host compiler's -Werror
  # and nvcc's -Werror=all-warnings (meson.build; it covers the device front end's
  # diagnostics such as #128-D and #177-D). A build that fails only under -Werror (the
  # device's compiler may warn where CI's does not) is built again without it, so that the
  # tests and benchmarks still run: summary.txt then says BUILD WARNINGS with the first
  # warnings, and the script exits non-zero.
  # CLI11 (the example trainer's options, header-only): the device has no network, so when
  # the header is missing scripts/deps.sh unpacks the package carried in .deb/ (git-ignored).
  bash -c 'source scripts/deps.sh && shardopt_cli11' >>"$OUT/build.log" 2>&1 ||
    log "NO CLI11: carry .deb/libcli11-dev_*.deb (apt-get download libcli11-dev) to build the trainer"
  { [ -f "$BUILD/build.ninja" ] ||
      meson setup "$BUILD" -Dcuda-arch=90 -Dbuildtype=release -Dwerror=true; } >>"$OUT/build.log" 2>&1
  if ninja -C "$BUILD" >>"$OUT/build.log" 2>&1; then
    log "build ok (warnings are errors)"
  elif meson configure "$BUILD" -Dwerror=false >>"$OUT/build.log" 2>&1 && ninja -C "$BUILD" >>"$OUT/build.log" 2>&1; then
    log "BUILD WARNINGS: the build fails with warnings as errors; built without -Werror (build.log has them all):"
    grep -E '(warning|error)( #[0-9]+-D)?:' "$OUT/build.log" | head -20 | tee -a "$SUMMARY"
    status=1
  else
    log "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1
  fi
}

run_suite() {  # name, meson test args...
  local name="$1"; shift
  local t0=$SECONDS lb="${MESON_LOGBASE:-testlog}"  # MESON_LOGBASE: lanes sharing one build dir
  meson test -C "$BUILD" --no-rebuild --print-errorlogs --logbase "$lb" "$@" >>"$OUT/tests.log" 2>&1
  log "$name: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$BUILD/meson-logs/$lb.txt" | tr -s ' ' | tr '\n' ' ') ($((SECONDS - t0)) s)"
  grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT)' "$BUILD/meson-logs/$lb.txt" | tee -a "$SUMMARY" || true
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
  python3 bench/peers/adam_peer.py --out $T/peer_adam.json >>"$OUT/bench.log" 2>&1 || log "adam peer failed"
  # The 8-bit moment row's peer: bitsandbytes (not installed on the GPU machine: install its
  # wheel first, e.g. pip install --no-deps .wheels/bitsandbytes-*.whl, carried with the tree).
  if python3 -c 'import bitsandbytes' >/dev/null 2>&1; then
    (cd bench/peers && python3 bnb_adam_peer.py --out $T/peer_adam.json) >>"$OUT/bench.log" 2>&1 || log "bnb peer failed"
  else
    log "adam: bitsandbytes does not import: the q8 row has no peer"
  fi
  "$BUILD/bench/bench_adam" --peer-json $T/peer_adam.json --results bench/results >$T/b.log 2>&1
  cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
  mkdir -p $T/adam_check
  "$BUILD/bench/bench_adam" --torch-check-dir $T/adam_check >>"$OUT/bench.log" 2>&1 &&
    python3 bench/peers/adam_torch_check.py --dir $T/adam_check 2>&1 | tee -a "$OUT/bench.log" | grep -E "PASS|FAIL" | tee -a "$SUMMARY"
}

phase_mxfp8() {
  log "== mxfp8"
  timeout 180 "$BUILD/bench/bench_mxfp8" --results bench/results >$T/b.log 2>&1; cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
}

phase_nvfp4() {
  log "== nvfp4"
  timeout 180 "$BUILD/bench/bench_nvfp4" --results bench/results >$T/b.log 2>&1; cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
}

phase_comm() {
  log "== comm ($GPUS ranks)"
  $MPIRUN -n "$GPUS" "$BUILD/bench/bench_comm" --results bench/results >$T/b.log 2>&1; cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
}

# The processes under PID (children, grandchildren, ...), one per line.
descendants() {
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}

# run_watched LIMIT_S LOG N BINARY ARGS...: runs `$MPIRUN -n N BINARY ARGS` with its output in LOG
# (as it comes). A job still running after LIMIT_S seconds leaves evidence in
# $OUT/hang.log before it is ended: each rank's threads' stacks (gdb, when the machine has
# it), then SIGUSR1 to each rank (bench_comm prints its last progress line and its main
# thread's stack; a binary without a handler just ends), then TERM and KILL. Returns the
# job's exit status, or 124 after a hang.
run_watched() {
  local limit="$1" logf="$2" ranks_n="$3" exe="$4"; shift 4
  $MPIRUN -n "$ranks_n" "$exe" "$@" >"$logf" 2>&1 &
  local job=$! waited=0
  while kill -0 "$job" 2>/dev/null && [ "$waited" -lt "$limit" ]; do sleep 1; waited=$((waited + 1)); done
  if ! kill -0 "$job" 2>/dev/null; then wait "$job"; return $?; fi
  local ranks=() p first
  for p in $(descendants "$job"); do
    first=$(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | head -1)
    [ "$(basename "${first:-none}")" = "$(basename "$exe")" ] && ranks+=("$p")
  done
  {
    echo "== $(date -u +%T) still running after ${limit} s: mpirun $exe $* (ranks: ${ranks[*]:-none found})"
    for p in "${ranks[@]}"; do
      echo "-- rank process $p"
      gdb_bin=$(command -v gdb || command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)  # the device has cuda-gdb only
      if [ -x "$gdb_bin" ]; then
        timeout 60 "$gdb_bin" -p "$p" -batch -ex 'thread apply all bt' 2>&1 | grep -E '^(Thread |#)' | head -400
      fi
    done
  } >>"$OUT/hang.log"
  for p in "${ranks[@]}"; do kill -USR1 "$p" 2>/dev/null; done
  sleep 5
  kill -TERM "$job" 2>/dev/null; sleep 10
  kill -KILL "$job" "${ranks[@]}" 2>/dev/null; wait "$job" 2>/dev/null
  { echo "-- the job's last output:"; tail -60 "$logf"; } >>"$OUT/hang.log"
  return 124
}

# GradReducePrecision::F32Accumulate (issue 31), at 2 ranks and at all GPUs, in one job:
# its reduce-scatter against NCCL's bf16 one (bus bandwidth fraction, 16..1024 MiB) and
# against an fp32 reduce-scatter of the upcast buffer, the stores' per-bucket reduces,
# then the whole distributed-Adam step with each. NCCL's warnings go to the log; a hang
# leaves stacks in hang.log (run_watched), and bench_comm's own waits give up after
# --wait-timeout-s with an error naming the wait.
phase_reduce() {
  local n rc
  for n in $(printf '%s\n' 2 "$GPUS" | awk '!seen[$0]++'); do  # each count once
    [ "$n" -le "$GPUS" ] || continue
    log "== reduce: F32Accumulate vs NCCL bf16 / fp32 reduce-scatter ($n ranks)"
    (export NCCL_DEBUG=WARN; run_watched 300 $T/b.log "$n" "$BUILD/bench/bench_comm" --f32-accumulate \
      --sizes-mib 16,64,256,1024 --iters 20 --wait-timeout-s 60 --results bench/results)
    rc=$?; cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
    [ "$rc" -eq 0 ] || log "bench_comm --f32-accumulate ($n ranks) exit $rc$([ "$rc" -eq 124 ] && echo ': hung, see hang.log'); last: $(grep '^bench_comm:' $T/b.log | tail -1)"
    log "== reduce: distributed-Adam step, F32Accumulate vs Native ($n ranks)"
    (export NCCL_DEBUG=WARN; run_watched 200 $T/b.log "$n" "$BUILD/bench/bench_dist_adam" --grad-reduce-precision \
      --results bench/results)
    rc=$?; cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
    [ "$rc" -eq 0 ] || log "bench_dist_adam --grad-reduce-precision ($n ranks) exit $rc$([ "$rc" -eq 124 ] && echo ': hung, see hang.log')"
  done
}

phase_dist() {
  for n in $(printf '%s\n' "$GPUS" 2 1 | awk '!seen[$0]++'); do  # each count once
    [ "$n" -le "$GPUS" ] || continue
    log "== dist-adam ($n ranks)"
    timeout 150 $TORCHRUN --nproc_per_node "$n" bench/peers/dist_adam_peer.py --out $T/peer_dist.tsv >>"$OUT/bench.log" 2>&1 || log "dist peer failed"
    timeout 150 $MPIRUN -n "$n" "$BUILD/bench/bench_dist_adam" --peer $T/peer_dist.tsv --results bench/results >$T/b.log 2>&1
    cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
  done
}

phase_phases() {  # PHASE_RANKS: the rank counts (default "1 2")
  for n in ${PHASE_RANKS:-1 2}; do
    [ "$n" -le "$GPUS" ] || continue
    log "== dist-adam phases ($n ranks)"
    timeout 200 $MPIRUN -n "$n" "$BUILD/bench/bench_dist_adam" --phases --results bench/results >$T/b.log 2>&1
    cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
  done
}

phase_hostcpu() {
  for n in $(printf '%s\n' "$GPUS" 2 1 | awk '!seen[$0]++'); do  # each count once
    [ "$n" -le "$GPUS" ] || continue
    for mixing in default 0; do  # NCCL's graph-mixing support adds event nodes per NCCL launch
      [ "$n" -gt 1 ] || [ "$mixing" = default ] || continue
      log "== host CPU per step ($n ranks, NCCL_GRAPH_MIXING_SUPPORT $mixing)"
      if [ "$mixing" = 0 ]; then env=(NCCL_GRAPH_MIXING_SUPPORT=0); else env=(); fi
      timeout 120 env "${env[@]}" $MPIRUN -n "$n" "$BUILD/bench/bench_dist_adam" --host-cpu-only --results bench/results >$T/b.log 2>&1
      cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
    done
  done
}

phase_fsdp() {  # bf16 params (with the FSDP2 and Megatron-FSDP peers) and MXFP8 params; all GPUs, 2, 1 (FSDP_ONE=0: all only)
  [ -x "$BUILD/bench/bench_fsdp" ] || return 0
  # Megatron-FSDP (pip megatron-fsdp) when it imports: the device has no index to install
  # from, so a run carries the wheels (.whl/, git-ignored) and installs them first:
  #   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  #     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  local megatron=() why
  if why=$(python3 -c 'import megatron_fsdp; print(megatron_fsdp.__version__)' 2>&1); then
    megatron=(--peer-megatron $T/peer_megatron.tsv)
    log "megatron-fsdp $(tail -1 <<<"$why"): the second FSDP peer (bf16)"
    python3 bench/peers/megatron_fsdp_peer.py --mxfp8-support 2>>"$OUT/bench.log" | tee -a "$SUMMARY"
  else
    log "megatron-fsdp NOT importable ($(tail -1 <<<"$why")): no vs-Megatron-FSDP rows; install its wheel (see phase_fsdp)"
  fi
  for n in $(printf '%s\n' "$GPUS" 2 1 | awk '!seen[$0]++'); do
    [ "$n" -le "$GPUS" ] || continue
    [ "$n" -eq "$GPUS" ] || [ "${FSDP_ONE:-1}" = 1 ] || continue
    log "== fsdp ($n ranks)"
    timeout 150 $TORCHRUN --nproc_per_node "$n" bench/peers/fsdp_peer.py --out $T/peer_fsdp.tsv >>"$OUT/bench.log" 2>&1 || log "fsdp peer failed"
    if [ ${#megatron[@]} -gt 0 ]; then
      rm -f $T/peer_megatron.tsv  # no stale timing stands in for a failed run
      timeout 200 $TORCHRUN --nproc_per_node "$n" bench/peers/megatron_fsdp_peer.py --out $T/peer_megatron.tsv \
        >>"$OUT/bench.log" 2>&1 || log "megatron-fsdp peer failed ($n ranks; its traceback is in bench.log)"
    fi
    timeout 150 $MPIRUN -n "$n" "$BUILD/bench/bench_fsdp" --peer $T/peer_fsdp.tsv "${megatron[@]}" --results bench/results >$T/b.log 2>&1
    timeout 150 $MPIRUN -n "$n" "$BUILD/bench/bench_fsdp" --params mxfp8 --results bench/results >>$T/b.log 2>&1
    cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
  done
}

phase_trainer() {
  [ -x "$BUILD/examples/trainer/bench_trainer" ] || return 0
  log "== trainer ($GPUS ranks)"
  timeout 240 $MPIRUN -n "$GPUS" "$BUILD/examples/trainer/bench_trainer" --results bench/results >$T/b.log 2>&1
  timeout 240 $MPIRUN -n "$GPUS" "$BUILD/examples/trainer/bench_trainer" --params mxfp8 --graphs on --results bench/results >>$T/b.log 2>&1
  cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
}

phase_muon() {
  for n in $(printf '%s\n' 1 2 "$GPUS" | awk '!seen[$0]++'); do  # each count once
    [ "$n" -le "$GPUS" ] || continue
    log "== muon ($n ranks)"
    rm -f $T/peer_muon.tsv
    if [ "$n" -eq 1 ]; then
      timeout 300 python3 bench/peers/muon_peer.py --out $T/peer_muon.tsv >>"$OUT/bench.log" 2>&1 || log "muon peer failed"
    else
      timeout 300 $TORCHRUN --nproc_per_node "$n" bench/peers/muon_peer.py --out $T/peer_muon.tsv >>"$OUT/bench.log" 2>&1 ||
        log "muon peer failed"
    fi
    timeout 300 $MPIRUN -n "$n" "$BUILD/bench/bench_muon" --peer $T/peer_muon.tsv --results bench/results >$T/b.log 2>&1 ||
      log "bench_muon ($n ranks) exit $?"
    cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
  done
}

phase_checkpoint() {
  log "== checkpoint (1 rank; disk: $(df -h /tmp | awk 'NR == 2 { print $2 " " $1 }'))"
  timeout 500 $MPIRUN -n 1 "$BUILD/bench/bench_checkpoint" --reps "${CKPT_REPS:-3}" --results bench/results --dir /tmp/shardopt-bench-ckpt \
    >$T/b.log 2>&1 || log "checkpoint bench failed (exit $?)"
  cat $T/b.log >>"$OUT/bench.log"; bench_line $T/b.log
}

phase_main() {
  log "== README main command on GPUs (2 ranks)"
  BUILD_DIR="$BUILD" timeout 120 bash scripts/run_main.sh >$T/b.log 2>&1
  cat $T/b.log >>"$OUT/bench.log"; grep -E "step|loss" $T/b.log | tail -4 | tee -a "$SUMMARY"
}

# gpt: the example trainer's character-level GPT (--model gpt --size baby) on Shakespeare
# against its PyTorch peer (bench/peers/gpt_peer.py: the same initial weights from
# --save-init, batches, schedule; AdamW(fused=True) under DDP, eager and torch.compile), on
# 1 GPU and then 2 (global batch 16384 tokens either way): bench/results/gpt.jsonl rows
# (iteration ms, final validation loss of each) and $OUT/gpt_curves_nN.png. The token files
# must be in GPT_DATA (default data/shakespeare: tools/shakespeare_data.py, made before the
# run, since the device has no network). GPT_STEPS (default 300).
phase_gpt() {
  local trainer="$BUILD/examples/trainer/trainer" data="${GPT_DATA:-data/shakespeare}" steps="${GPT_STEPS:-300}"
  [ -x "$trainer" ] || { log "FAIL gpt: no $trainer (run the build phase first)"; return 1; }
  if [ ! -f "$data/manifest.json" ]; then
    python3 tools/shakespeare_data.py --out "$data" >>"$OUT/bench.log" 2>&1 ||
      { log "FAIL gpt: no $data/manifest.json (make it with tools/shakespeare_data.py before the run)"; return 1; }
  fi
  local n tok init c
  for n in 1 2; do
    [ "$n" -le "$GPUS" ] || continue
    log "== gpt baby ($n ranks, $steps steps)"
    tok=$((16384 / n)); init="$T/gpt_init_n$n"; rm -rf "$init"
    local common=(--data "$data" --tokens "$tok" --steps "$steps" --microbatches 1 --eval-every 50 --eval-batches 4
                  --lr 1e-3 --weight-decay 0.1)
    timeout 500 $MPIRUN -n "$n" "$trainer" --model gpt --size baby --task shakespeare "${common[@]}" --save-init "$init" \
      --metrics "$T/gpt_ours_n$n.jsonl" --sample 300 --log-every 50 >$T/b.log 2>&1 || log "FAIL gpt trainer ($n ranks)"
    cat $T/b.log >>"$OUT/bench.log"; grep -E "val loss" $T/b.log | tail -1 | tee -a "$SUMMARY"
    for c in eager compiled; do
      timeout 500 $TORCHRUN --nproc_per_node "$n" bench/peers/gpt_peer.py --init "$init" "${common[@]}" \
        --metrics "$T/gpt_peer_${c}_n$n.jsonl" $([ "$c" = compiled ] && echo --compile) >>"$OUT/bench.log" 2>&1 ||
        log "FAIL gpt peer $c ($n ranks)"
    done
    python3 bench/peers/gpt_peer.py --compare "$T/gpt_ours_n$n.jsonl" "$T/gpt_peer_eager_n$n.jsonl" \
      "$T/gpt_peer_compiled_n$n.jsonl" --config "baby/n$n" --results bench/results --plot "$OUT/gpt_curves_n$n.png" \
      --command "GPT_STEPS=$steps bash scripts/device_suite.sh gpt ($n ranks: trainer --model gpt --size baby --task shakespeare ${common[*]}; gpt_peer.py eager and --compile)" \
      2>&1 | tee -a "$SUMMARY"
  done
}

# ---------------------------------------------------------------- sanitize
# The gate's scheduling (issue 49). A sanitizer run's wall time depends on how many others
# share the GPU and the host with it: gpu_mpi_trainer_n1's memcheck takes ~207 s alone on an
# H100 and 271-307 s with 8 runs at a time; on an H200 at 8 at a time it ran past the old
# fixed 320 s limit, and the gate said FAIL with 0 errors found. A limit is there to catch
# a hang, not to time the run, so:
#  - each run has an expected time, SAN_EXPECT below: the slowest of the five green gates
#    of 2026-11-27 (SAN_JOBS=8, one GPU, 16 cores: four on an H100, one on an H200);
#  - its limit is SAN_MARGIN x expected x load, and at least the floor (SAN_MEMCHECK_S per
#    rank, SAN_CHECK_S). load is 1 up to the crowding the table was measured at (8 runs on
#    one GPU, one run per 2 cores) and grows in proportion beyond it: more runs at a time,
#    or fewer cores, stretch every limit, so the verdict does not depend on SAN_JOBS;
#  - the runs start longest expected first (a run the table does not list counts as a
#    long one), SAN_JOBS at a time: the long ones never start late behind short ones, and
#    the phase ends near max(longest run, sum of runs / SAN_JOBS), ~5-6 min on one H100.
#    (Running the long ones alone, the other way, would put their ~10 min, estimated, of
#    sanitizing one after another into the phase.)
#  - a timeout stays a FAIL (and the limit is in sanitize.log's header of the run).
#    summary.txt keeps the order of declaration (the memcheck suites, then racecheck, then
#    synccheck), whatever the order of starting.
# A run that grows past its entry still passes up to the margin; update the entry from the
# "(NNs)" of its ok line (taken at SAN_JOBS=8 on 16 cores) when it moves.
CS="${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}"
SAN_MEMCHECK_S="${SAN_MEMCHECK_S:-320}"  # the least limit of a memcheck run, per rank
SAN_CHECK_S="${SAN_CHECK_S:-150}"        # the least limit of a racecheck / synccheck run
SAN_MARGIN="${SAN_MARGIN:-2}"            # limit = margin x expected x load (decimals allowed)
SAN_JOBS="${SAN_JOBS:-6}"                # sanitizer runs at a time
SAN_ONLY="${SAN_ONLY:-}"                 # a regex: only the runs whose suite name matches (default: all)
SAN_CORES="${SAN_CORES:-$(nproc 2>/dev/null || echo 16)}"  # host cores (the budgets' load term)
SAN_FAILED=0
status=0
# Expected seconds of each run ("TOOL LABEL"), at 8 at a time on one GPU and 16 cores.
# memcheck gpu_mpi_trainer_n1: 307 s measured; 330 since the H200 run above ran past 320 s.
declare -A SAN_EXPECT=(
  ["memcheck gpu_mpi_trainer_n1"]=330           ["memcheck gpu_nvfp4"]=244
  ["memcheck gpu_mpi_trainer_gpt_n1"]=172       ["memcheck gpu_mxfp8"]=140
  ["racecheck gpu_mxfp8"]=112                   ["memcheck gpu_mxfp8_shard_batch"]=100
  ["memcheck gpu_mpi_muon_n1"]=95               ["racecheck gpu_mpi_muon"]=76
  ["racecheck gpu_mxfp8_shard_batch"]=68        ["synccheck gpu_mxfp8"]=61
  ["memcheck gpu_mpi_checkpoint_n1"]=58         ["memcheck gpu_mpi_muon_checkpoint_n1"]=58
  ["memcheck gpu_trainer_gpt_ops"]=55           ["synccheck gpu_mxfp8_shard_batch"]=50
  ["memcheck gpu_mpi_nvfp4_params_n1"]=48       ["memcheck gpu_mxfp8_batch"]=42
  ["memcheck gpu_adam_mxfp8"]=39                ["memcheck gpu_comm_self"]=38
  ["memcheck gpu_mpi_distributed_adam_n1"]=38   ["memcheck gpu_mpi_fsdp_mxfp8_n1"]=38
  ["memcheck gpu_mpi_kernel_preload_fsdp_n1"]=36 ["memcheck gpu_mpi_step_graph_stream_n1"]=34
  ["memcheck gpu_mpi_watchdog_n1"]=33           ["memcheck gpu_mpi_kernel_preload_dist_adam_n1"]=32
  ["memcheck gpu_mpi_bucket_store_n1"]=30       ["racecheck gpu_adam_amax"]=29
  ["racecheck gpu_mxfp8_batch"]=29              ["memcheck gpu_piece_sum"]=23
  ["racecheck gpu_nvfp4"]=23                    ["racecheck gpu_adam"]=22
  ["racecheck gpu_dependent_launch"]=22         ["memcheck gpu_adam"]=21
  ["synccheck gpu_mpi_muon"]=21                 ["synccheck gpu_dependent_launch"]=16
  ["synccheck gpu_nvfp4"]=16                    ["memcheck gpu_dependent_launch"]=15
  ["synccheck gpu_adam_amax"]=15                ["synccheck gpu_mxfp8_batch"]=14
  ["memcheck gpu_adam_amax"]=7                  ["memcheck gpu_byte_copies"]=4
  ["memcheck gpu_mxfp8_decode"]=4               ["racecheck gpu_adam_mxfp8"]=4
  ["racecheck gpu_trainer_ops"]=4               ["synccheck gpu_adam"]=4
  ["memcheck gpu_trainer_ops"]=3                ["synccheck gpu_adam_mxfp8"]=2
  ["synccheck gpu_trainer_ops"]=1
)
SAN_EXPECT_MEMCHECK=150  # a memcheck run the table does not list (a new suite, the 2-rank run)
SAN_EXPECT_CHECK=75      # a racecheck / synccheck run it does not list

# The limit of one run: san_budget TOOL EXPECTED_S RANKS (the formula above).
san_budget() {
  local floor=$SAN_CHECK_S
  [ "$1" = memcheck ] && floor=$((SAN_MEMCHECK_S * $3))
  awk -v e="$2" -v m="$SAN_MARGIN" -v f="$floor" -v j="$SAN_JOBS" -v c="$SAN_CORES" 'BEGIN {
    load = 1                                # measured at 8 runs on one GPU, 16 cores
    if (j / 8 > load) load = j / 8          # more runs share the GPU
    if (j * 2 / c > load) load = j * 2 / c  # more than one run per 2 cores
    b = m * e * load; if (b > int(b)) b = int(b) + 1; if (b < f) b = f
    print b }'
}

# One compute-sanitizer run: san_run_one SLOT TOOL LABEL LIMIT_S RANKS COMMAND...
# RANKS: how many "... SUMMARY" lines the output must hold (one per process). PASS needs
# exit 0, every summary present and 0 errors; a timeout, a missing summary, an error
# count above 0 or a non-zero exit (a failing test, or exit 77: no GPU) is a FAIL line.
san_run_one() {  # slot, tool, label, limit, ranks, command...: output in $SAN_DIR/slot.{log,status}
  local slot="$1" tool="$2" label="$3" limit="$4" ranks="$5"; shift 5
  local tmp="$SAN_DIR/$slot.log"
  local t0=$SECONDS
  { echo "===== $tool $label: $*"
    echo "===== limit ${limit}s, started $((t0 - SAN_T0))s into the phase"; } >"$SAN_DIR/$slot.head"
  timeout -k 15 "$limit" "$@" </dev/null >"$tmp" 2>&1
  local rc=$? dt=$((SECONDS - t0))
  local summaries errors warnings
  if [ "$tool" = racecheck ]; then
    # ========= RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)
    summaries=$(grep -c 'RACECHECK SUMMARY:' "$tmp")
    errors=$(sed -n 's/.*RACECHECK SUMMARY:.*(\([0-9]*\) error.*/\1/p' "$tmp" | awk '{n += $1} END {print n + 0}')
    warnings=$(sed -n 's/.*RACECHECK SUMMARY:.* \([0-9]*\) warning.*/\1/p' "$tmp" | awk '{n += $1} END {print n + 0}')
  else
    # ========= ERROR SUMMARY: N errors
    summaries=$(grep -c 'ERROR SUMMARY:' "$tmp")
    errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$tmp" | awk '{n += $1} END {print n + 0}')
    warnings=0
  fi
  local why=""
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="timed out after ${limit}s (incomplete)"
  elif [ "$errors" -gt 0 ]; then why="$errors errors"
  elif [ "$summaries" -lt "$ranks" ]; then why="$summaries of $ranks sanitizer summaries (exit $rc)"
  elif [ "$rc" -ne 0 ]; then why="exit $rc"
  fi
  if [ -n "$why" ]; then
    echo "FAIL sanitize $tool $label: $why (${dt}s)" >"$SAN_DIR/$slot.status"
  elif [ "$warnings" -gt 0 ]; then
    echo "ok   sanitize $tool $label: 0 errors, $warnings warnings (see sanitize.log) (${dt}s)" >"$SAN_DIR/$slot.status"
  else
    echo "ok   sanitize $tool $label: 0 errors (${dt}s)" >"$SAN_DIR/$slot.status"
  fi
}

# san_run TOOL LABEL RANKS COMMAND... queues a run (its slot: the order of declaration);
# san_collect starts the queue longest expected first, at most SAN_JOBS at a time (the
# sanitizers are mostly host-bound; several share the GPU well), waits for all, then
# writes the results in slot order.
san_reset() { SAN_SLOT=0; SAN_CMDS=(); SAN_ORDER=(); SAN_T0=$SECONDS; }
san_reset
san_run() {  # tool, label, ranks, command...
  local tool="$1" label="$2" ranks="$3"; shift 3
  local expected="${SAN_EXPECT[$tool $label]:-}"
  if [ -z "$expected" ]; then
    if [ "$tool" = memcheck ]; then expected=$SAN_EXPECT_MEMCHECK; else expected=$SAN_EXPECT_CHECK; fi
  fi
  SAN_SLOT=$((SAN_SLOT + 1))
  SAN_CMDS[SAN_SLOT]="$(printf '%q ' "$(printf %03d "$SAN_SLOT")" "$tool" "$label" \
    "$(san_budget "$tool" "$expected" "$ranks")" "$ranks" "$@")"
  SAN_ORDER+=("$expected $SAN_SLOT")
}
san_collect() {
  local order=() e i f slot line
  [ "${#SAN_ORDER[@]}" -eq 0 ] || mapfile -t order < <(printf '%s\n' "${SAN_ORDER[@]}" | sort -k1,1nr -k2,2n)
  for e in "${order[@]}"; do
    i=${e#* }
    while [ "$(jobs -rp | wc -l)" -ge "$SAN_JOBS" ]; do wait -n || true; done
    eval "san_run_one ${SAN_CMDS[i]}" &
  done
  wait
  for f in "$SAN_DIR"/*.status; do
    [ -e "$f" ] || continue
    slot=$(basename "$f" .status)
    cat "$SAN_DIR/$slot.head" "$SAN_DIR/$slot.log" >>"$OUT/sanitize.log"
    line=$(cat "$f")
    log "$line"
    case "$line" in FAIL*) SAN_FAILED=1 ;; esac
  done
}

# The single-GPU suites (meson suite "gpu"), from the build's own test list, one line each:
# "name exe ranks ENV :: ARGS" -- ranks 0 = a plain process, 1 = run_mpi.sh's one-rank
# mpirun; ENV the test's own environment (K=V words, shell-quoted: a suite that meson gives
# its data directory needs it under the sanitizer too) and ARGS its arguments after the
# executable (a --gtest_filter that keeps one case per process), both for eval.
gpu_suites() {  # suite name
  meson introspect "$BUILD" --tests | python3 -c '
import json, os, shlex, sys
for t in json.load(sys.stdin):
    if "shardopt:" + sys.argv[1] not in t["suite"]:
        continue
    c = t["cmd"]
    if len(c) >= 5 and c[1].endswith("run_mpi.sh"):  # sh run_mpi.sh MPIEXEC N EXE ARGS (EXE relative to the build)
        exe, ranks, args = os.path.join(t.get("workdir") or sys.argv[2], c[4]), c[3], c[5:]
    else:
        exe, ranks, args = c[0], 0, c[1:]
    env = " ".join(shlex.quote(k + "=" + v) for k, v in sorted((t.get("env") or {}).items()))
    print(t["name"], exe, ranks, env, "::", " ".join(shlex.quote(a) for a in args))
' "$1" "$(cd "$BUILD" && pwd)"
}

phase_sanitize() {
  : >"$OUT/sanitize.log"
  log "== sanitize ($CS, $GPUS GPUs)"
  if [ ! -x "$CS" ]; then CS=$(command -v compute-sanitizer || true); fi
  if [ -z "$CS" ] || [ ! -x "$CS" ]; then log "FAIL sanitize: compute-sanitizer not found"; status=1; return 1; fi
  if [ ! -f "$BUILD/build.ninja" ]; then log "FAIL sanitize: no $BUILD (run the build phase first)"; status=1; return 1; fi
  "$CS" --version 2>&1 | tail -1 | tee -a "$SUMMARY"
  SAN_FAILED=0
  SAN_DIR=$(mktemp -d)
  san_reset
  local cs_args=(--error-exitcode 1)
  local name exe ranks suites
  suites=$(gpu_suites gpu)
  if [ -z "$suites" ]; then log "FAIL sanitize: no gpu suites in $BUILD"; status=1; return 1; fi

  # memcheck: every single-GPU suite, whole binary. Suites that create NCCL communicators
  # (gpu_comm_self, gpu_mpi_*) run with --report-api-errors no: NCCL 2.28's own start-up
  # returns CUDA API errors it expects and handles (cuMemCreate of a fabric handle gives
  # CUDA_ERROR_NOT_PERMITTED without IMEX, and ncclMemAlloc retries without it;
  # cudaFuncGetAttributes on kernels without an image for this GPU), 432 such reports on
  # 2026-11-25 on an H100, none from shardopt's own calls. Every CUDA call shardopt makes
  # is checked and throws, so an API error of ours fails the suite itself; memory-access
  # checking stays on for all suites, and API errors are reported for every other suite.
  local api_args rest test_env test_args
  while read -r name exe ranks rest; do
    [ -z "$SAN_ONLY" ] || [[ "$name" =~ $SAN_ONLY ]] || continue
    # The PyTorch comparison (gpu_muon_torch_check) is a Python program running torch's own
    # kernels; its C++ half is ours and runs under gpu_mpi_muon's memcheck.
    case "$name" in *torch*) continue ;; esac
    eval "test_env=(${rest%%::*})"; eval "test_args=(${rest#*::})"
    api_args=()
    case "$name" in gpu_mpi_* | gpu_comm_self) api_args=(--report-api-errors no) ;; esac
    if [ "$ranks" -eq 0 ]; then
      san_run memcheck "$name" 1 env "${test_env[@]}" \
        "$CS" --tool memcheck "${cs_args[@]}" "${api_args[@]}" "$exe" "${test_args[@]}"
    else
      san_run memcheck "$name" "$ranks" env "${test_env[@]}" SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda \
        $MPIRUN -n "$ranks" "$CS" --tool memcheck "${cs_args[@]}" "${api_args[@]}" "$exe" "${test_args[@]}"
    fi
  done <<<"$suites"

  # racecheck + synccheck: the kernels with __shared__, __syncthreads* or __shfl*_sync, on
  # test cases that launch them (filtered where the whole binary is slow; with
  # SHARDOPT_SANITIZER_CASES=1, which gpu_nvfp4 reads: its sanitizer-sized case list):
  #   gpu_adam              grad_sumsq_kernel, grad_sumsq_finish_kernel (src/kernels/adam/grad_norm.cu)
  #   gpu_mxfp8             quantize_kernel<One> (mxfp8_batch.cu), shard_kernel (mxfp8_shard.cu),
  #                         the warp shuffles of mxfp8_tile.cuh, per tensor
  #   gpu_mxfp8_batch       quantize_kernel<TensorList> (mxfp8_batch.cu)
  #   gpu_mxfp8_shard_batch shard_kernel over tables (mxfp8_shard.cu), both phases
  #   gpu_nvfp4             the tiled NVFP4 kernels (nvfp4.cu, nvfp4_shard.cu: warp shuffles;
  #                         one warp per tile), whole tensor, batch and sharded
  #   gpu_adam_amax         adam_apply_kernel's NVFP4 amax-emitting variant (shared slots, atomics)
  #   gpu_adam_q8           adam_q8_kernel (adam_q8.cu): the maps in shared memory, the block
  #                         scales by warp shuffles
  #   gpu_adam_mxfp8        adam_owned_kernel (mxfp8_shard.cu): Adam over owned MXFP8 tile rows, both
  #                         planes quantized from the new masters (shared memory, barriers)
  #   gpu_mpi_muon          the Muon kernels of muon.cu (block reductions, the mirror's shared-memory
  #                         tiles), one rank as a singleton. Not SymmetricProductsAgreeWithDenseOnes:
  #                         on its 520 x 600 shapes cuBLASLt runs an nvjet kernel (its own
  #                         sm90 GEMM) in which racecheck reports shared-memory hazards (H200,
  #                         2026-12-03). That kernel is cuBLAS's, not ours (docs/muon.md)
  #   gpu_dependent_launch  the quantize kernels launched as programmatic dependent launches
  #                         (griddepcontrol wait / launch_dependents), eager and captured, behind
  #                         a producer kernel of the test (kernels/common/dependent_launch.cuh)
  #   gpu_trainer_ops       block_sum / block_max users and k_embed_links, k_dispatch_assign,
  #                         k_sumsq_partial / k_sumsq_final (examples/trainer/cuda_*.cu)
  # (test/gpu/test_comm_kernels.cu's spin_then_fill_kernel has a barrier but runs only in
  # the 2- and 4-rank gpu_mpi_comm suites: see the 2-GPU memcheck below.)
  local targets=(
    "test/gpu_adam FusedAdamGpu.FoundInfLeavesEverythingUntouched:FusedAdamGpu.GraphReplaysEqualEagerStepsBitwise"
    "test/gpu_mxfp8 Mxfp8Gpu.RandomShapesMatchReference:Mxfp8Gpu.SpecialValuesMatchReference:Mxfp8Gpu.MisalignedPointersAndOddWidthsUseTheScalarPaths:Mxfp8Gpu.GroupedEqualsDiscreteAndHonoursTheSkipFlag:Mxfp8Gpu.MemberTableWithScatteredMembers:Mxfp8Gpu.ShardedWorldSizes1To8:Mxfp8Gpu.DequantizeEqualsHostTwin"
    "test/gpu_mxfp8_batch Mxfp8BatchGpu.AFirstUseUnderCaptureWorks:Mxfp8BatchGpu.MixedListsKernelEqualsHostTwinAndOracle:Mxfp8BatchGpu.EagerSkipFlagWritesNothing"
    "test/gpu_mxfp8_shard_batch Mxfp8ShardBatchGpu.OwnedPassesMixedListsOverWorldsOf1To8KernelEqualsHostTwinAndOracle:Mxfp8ShardBatchGpu.OwnedPassesBoundariesMisalignmentSpecialsAndSmallTensorsKernelEqualsHostTwin:Mxfp8ShardBatchGpu.AFirstUseUnderCaptureWorks:Mxfp8ShardBatchGpu.MixedListsOverWorldsOf1To8KernelEqualsHostTwinAndOracle:Mxfp8ShardBatchGpu.ScaleLayoutsAndListOrdersKernelEqualsHostTwin:Mxfp8ShardBatchGpu.MisalignedMastersAndDataPlanesKernelEqualsHostTwin:Mxfp8ShardBatchGpu.SpecialValuesInMidBlockRangesKernelEqualsHostTwin"
    "test/gpu_nvfp4 Nvfp4Gpu.TiledShapes:Nvfp4Gpu.TiledUnalignedBuffers:Nvfp4Gpu.TiledBatchEqualsHostBatch:Nvfp4Gpu.TiledShardedProtocol:Nvfp4Gpu.TiledShardBatchEqualsPerTensorCallsAndOracle"
    "test/gpu_adam_amax AdamAmaxGpu.EmitsThePartialAmaxesOfEveryRank"
    "test/gpu_adam_q8 AdamQ8Gpu.*"
    "test/gpu_adam_mxfp8 AdamMxfp8Gpu.SanitizerSized:AdamMxfp8Gpu.KernelEqualsHostTwinAndReplays"
    "test/gpu_dependent_launch DependentLaunchGpu.*"
    "test/gpu_mpi_muon MuonGpu.Bf16GemmUpdateWithinTheDerivedBound:MuonGpu.BatchedEqualShapesEqualOneByOneBitwise:MuonGpu.FoundInfChangesNothing:MuonGpu.MirrorFillsTheLowerPartFromTheUpperBf16:MuonGpu.MirrorFillsTheLowerPartFromTheUpperF32"
    "examples/trainer/gpu_trainer_ops OpsPair.ElementAndRowOps:OpsPair.EmbeddingForwardAndBackward:OpsPair.RouterDispatchCombine:OpsPair.CrossEntropyPackAndSumsq:OpsPair.F32NormWeightsAndF32InitAreBitwiseTheirBf16Twins"
  )
  local tool t bin filter
  for tool in racecheck synccheck; do
    for t in "${targets[@]}"; do
      read -r bin filter <<<"$t"
      [ -z "$SAN_ONLY" ] || [[ "$(basename "$bin")" =~ $SAN_ONLY ]] || continue
      if [ ! -x "$BUILD/$bin" ]; then log "FAIL sanitize $tool $(basename "$bin"): $BUILD/$bin not built"; SAN_FAILED=1; continue; fi
      san_run "$tool" "$(basename "$bin")" 1 env SHARDOPT_SANITIZER_CASES=1 SHARDOPT_BACKEND=cuda "$CS" --tool "$tool" \
        "${cs_args[@]}" "$BUILD/$bin" --gtest_filter="$filter"
    done
  done

  # With 2+ GPUs: memcheck on one 2-rank suite under mpirun (NCCL between two GPUs).
  if [ "$GPUS" -ge 2 ] && { [ -z "$SAN_ONLY" ] || [[ gpu_mpi_distributed_adam_n2 =~ $SAN_ONLY ]]; }; then
    exe=$(gpu_suites gpu-multi | awk '$1 == "gpu_mpi_distributed_adam_n2" { print $2 }')
    if [ -n "$exe" ]; then
      san_run memcheck gpu_mpi_distributed_adam_n2 2 env SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda \
        $MPIRUN -n 2 "$CS" --tool memcheck "${cs_args[@]}" --report-api-errors no "$exe"
    else
      log "FAIL sanitize memcheck gpu_mpi_distributed_adam_n2: not in $BUILD"; SAN_FAILED=1
    fi
  fi
  san_collect
  rm -rf "$SAN_DIR"
  if [ "$SAN_FAILED" -eq 0 ]; then log "sanitize: PASS"; else log "sanitize: FAIL"; status=1; fi
  return "$SAN_FAILED"
}

phases=("$@")
if [ ${#phases[@]} -eq 0 ]; then
  phases=(build tests1 adam mxfp8 nvfp4)
  [ "$GPUS" -ge 2 ] && phases+=(testsN comm dist fsdp trainer)
fi
: >"$SUMMARY"
for p in "${phases[@]}"; do "phase_$p"; done
tar czf "$OUT/results.tgz" bench/results 2>/dev/null
log "done in ${SECONDS}s"
exit "${status:-0}"  # non-zero when the sanitize phase found anything, or the build warned
