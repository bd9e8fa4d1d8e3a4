#!/usr/bin/env bash
# Call 10 (nvidia-h100-x4: four H100s; the sanitize gate of issue 29 asks for an H100), on the
# merged tree of this session. Lanes on separate GPUs run at once (CUDA_VISIBLE_DEVICES; each
# device_suite run has its own OUT and scratch folder):
#   PART=1: build, then
#     lane A (GPUs 0,1): the gpu-multi suite at 2 ranks (the 4-rank cases skip: 2 GPUs visible);
#     lane B (GPU 2):    the sanitize gate (memcheck runs every single-GPU suite whole: it is also
#                        the gpu suite's proof), racecheck + synccheck;
#     lane C (GPU 3):    the one-GPU benches: step phases at 1 rank, mxfp8, nvfp4, muon.
#   PART=2: lane A (GPUs 0,1) the 2-rank benches (phases, reduce, muon), then the gpu-multi
#     suite on all four GPUs (its 4-rank cases).
#   bash bench/results/runs/2026-11-27/10_x4.sh    (carry: .dev_data, .whl)
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
lane() {  # name, gpus, time limit, phases... (device_suite with its own OUT)
  local name="$1" gpus="$2" limit="$3"; shift 3
  mkdir -p "$OUT/$name"
  CUDA_VISIBLE_DEVICES="$gpus" OUT="$OUT/$name" timeout "$limit" bash scripts/device_suite.sh "$@" >/dev/null 2>&1
  say "lane $name ($gpus: $*) exit $?"
}
nvidia-smi -L | tee -a "$L"; git log --oneline -1 2>/dev/null | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; grep -B2 -A8 -m3 "error" "$OUT/build/build.log" | tee -a "$L"; exit 1; }
say "build done: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
if [ "${PART:-1}" = 1 ]; then
  lane A 0,1 $((585 - SECONDS)) testsN &
  SAN_JOBS=8 lane B 2 $((585 - SECONDS)) sanitize &
  PHASE_RANKS=1 lane C 3 $((585 - SECONDS)) phases mxfp8 nvfp4 muon &
  wait
else
  # PART=2 (after call 10's findings were fixed): the 2-rank benches on GPUs 0,1; the three
  # tools again on the suites that failed (GPU 2); bench_trace with the NVTX ranges compiled
  # in (build-gpu) and out (a second build of the library and bench_trace only: the replay
  # host time, issue 32) on GPU 3; then the Muon suites at 2 and 4 ranks on all four GPUs.
  SAN_JOBS=8 SAN_ONLY='^gpu_adam_mxfp8$|^gpu_mpi_muon_checkpoint_n1$' lane S 2 240 sanitize &
  ( CUDA_VISIBLE_DEVICES=3 bash -c 'meson setup build-nonvtx -Dcuda-arch=90 -Dbuildtype=release -Dnvtx=disabled \
      -Dtests=false -Dexamples=false && ninja -C build-nonvtx bench/bench_trace &&
      for i in 1 2; do build-gpu/bench/bench_trace --results bench/results; build-nonvtx/bench/bench_trace --results bench/results; done' \
      >"$OUT/trace.txt" 2>&1; say "bench_trace with and without NVTX exit $?"; grep -E '^\{"bench"' "$OUT/trace.txt" | cut -c1-400 >>"$L" ) &
  PHASE_RANKS=2 lane A2 0,1 300 phases reduce muon &
  wait
  timeout $((585 - SECONDS)) meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 1 \
    gpu_mpi_muon_checkpoint_n2 gpu_mpi_muon_checkpoint_n4 gpu_mpi_muon_n2 >"$OUT/muon_tests.txt" 2>&1
  say "muon suites at 2 and 4 ranks exit $?"; grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):" "$OUT/muon_tests.txt" | tee -a "$L"
fi
for d in "$OUT"/*/; do
  [ -f "$d/summary.txt" ] || continue
  { echo "=== $(basename "$d")"; grep -vhE '^\{"bench"' "$d/summary.txt" | grep -E "FAIL|TIMEOUT|gpu tests|sanitize:|exit|failed|build|PASS" | head -40; } >>"$L"
  grep -hE '^\{"bench"' "$d/summary.txt" | cut -c1-700 >>"$L"
done
tar czf "$OUT/results.tgz" bench/results "$OUT"/*/*.log "$OUT"/*/*.txt "$OUT"/*.txt 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name lanes.log -exec rm -rf {} +
say "all done"
