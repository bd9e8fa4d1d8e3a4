#!/usr/bin/env bash
# The MXFP8 owned pass without its 32-fold redundant column reduction and with the hardware
# bf16 pair conversion (src/kernels/mxfp8_shard.cu): oracle/twin tests, racecheck+synccheck of
# the owned cases, and the one-rank step and phases (bf16 vs MXFP8 in one run).
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
bash scripts/device_suite.sh build >/dev/null || { say "build failed"; tail -40 "$OUT/build.log" | tee -a "$L"; exit 1; }
say "build done"
B=build-gpu
$B/test/gpu_mxfp8_shard_batch >"$OUT/t.txt" 2>&1; say "gpu_mxfp8_shard_batch exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/t.txt" | tr '\n' ' ')"
grep -E "FAILED|Failure" "$OUT/t.txt" | head -20 >>"$L"
$B/test/gpu_mxfp8 >"$OUT/t2.txt" 2>&1; say "gpu_mxfp8 exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/t2.txt" | tr '\n' ' ')"
F="Mxfp8ShardBatchGpu.OwnedPassesMixedListsOverWorldsOf1To8KernelEqualsHostTwinAndOracle:Mxfp8ShardBatchGpu.OwnedPassesBoundariesMisalignmentSpecialsAndSmallTensorsKernelEqualsHostTwin"
for tool in racecheck synccheck; do
  SHARDOPT_SANITIZER_CASES=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 $B/test/gpu_mxfp8_shard_batch --gtest_filter="$F" >"$OUT/s.txt" 2>&1
  say "$tool owned: exit $? $(tail -2 "$OUT/s.txt" | tr '\n' ' ')"
done
$B/bench/bench_dist_adam --iters 20 >"$OUT/b1.txt" 2>&1; say "dist n1 exit $?"; grep -E '^\{' "$OUT/b1.txt" | cut -c1-400 >>"$L"
$B/bench/bench_dist_adam --phases --iters 10 >"$OUT/b2.txt" 2>&1; say "phases n1 exit $?"; grep -E "owned|quantize|amax|adam|step|^\{" "$OUT/b2.txt" | cut -c1-300 | head -40 >>"$L"
rm -f "$OUT"/t*.txt "$OUT/s.txt"; tar czf "$OUT/r.tgz" -C "$OUT" b1.txt b2.txt && rm -f "$OUT"/b*.txt
say done
