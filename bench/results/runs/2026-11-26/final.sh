#!/usr/bin/env bash
# The session's one proof run on the merged tree: build; then at once
#   lane A: the sanitize gate on GPU 1 (single-GPU suites: memcheck, racecheck, synccheck)
#   lane B: the single-GPU suites on GPU 0
#   lane C: the multi-GPU suites (2 ranks) on both GPUs
# then lane D alone: 2-rank memcheck + racecheck of the F32Accumulate suites, the reduce
# benchmark (issue 31), and the warm-up race check (issue 30: the old step_graph.cpp must fail).
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
L="$OUT/lanes.log"
say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
bash scripts/device_suite.sh build || { say "build failed"; exit 1; }
say "build done"
( CUDA_VISIBLE_DEVICES=1 SAN_JOBS=8 bash scripts/device_suite.sh sanitize >"$OUT/laneA.txt" 2>&1; echo "[$SECONDS s] lane A exit $?" >>"$OUT/laneA.txt" ) &
A=$!
( CUDA_VISIBLE_DEVICES=0 meson test -C build-gpu --no-rebuild --print-errorlogs --suite gpu --num-processes 2 \
    --timeout-multiplier 0.5 --logbase laneB >"$OUT/laneB.txt" 2>&1; echo "[$SECONDS s] lane B exit $?" >>"$OUT/laneB.txt" ) &
B=$!
( meson test -C build-gpu --no-rebuild --print-errorlogs --suite gpu-multi --num-processes 1 \
    --timeout-multiplier 0.5 --logbase laneC >"$OUT/laneC.txt" 2>&1; echo "[$SECONDS s] lane C exit $?" >>"$OUT/laneC.txt" ) &
C=$!
wait $B; say "lane B done: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$OUT/laneB.txt" | tr -s ' ' | tr '\n' ' ')"
wait $C; say "lane C done: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$OUT/laneC.txt" | tr -s ' ' | tr '\n' ' ')"
wait $A; say "lane A done: $(grep -E 'sanitize: ' "$OUT/laneA.txt" | tail -1)"
CS=/usr/local/cuda/bin/compute-sanitizer
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
for tool in memcheck racecheck; do
  for t in gpu_mpi_grad_reduce gpu_mpi_grad_reduce_opt; do
    [ $SECONDS -lt 440 ] || { say "skip $tool $t (time)"; continue; }
    timeout 90 env SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda $MPIRUN -n 2 $CS --tool $tool --report-api-errors no \
      build-gpu/test/$t >"$OUT/san2.tmp" 2>&1; rc=$?
    say "$tool $t n2: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san2.tmp" | tr -s ' ' | tr '\n' ' ')"
    cat "$OUT/san2.tmp" >>"$OUT/laneD.txt"
  done
done
rm -f "$OUT/san2.tmp"
[ $SECONDS -lt 470 ] && bash scripts/device_suite.sh reduce >>"$OUT/laneD.txt" 2>&1
say "reduce bench done"
if [ $SECONDS -lt 520 ]; then
  cp src/optimizer/step_graph.cpp /tmp/sg_new.cpp; cp .dev_final/step_graph_old.cpp src/optimizer/step_graph.cpp
  ninja -C build-gpu test/gpu_mpi_step_graph_stream >/dev/null 2>&1
  SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda timeout 60 $MPIRUN -n 2 build-gpu/test/gpu_mpi_step_graph_stream >>"$OUT/laneD.txt" 2>&1
  say "issue 30 race check with the OLD step_graph.cpp at 2 GPUs: exit $? (non-zero expected)"
  grep -E '^\[  (FAILED|PASSED|  OK) ' "$OUT/laneD.txt" | tail -8 | tee -a "$L"
  cp /tmp/sg_new.cpp src/optimizer/step_graph.cpp
fi
tar czf "$OUT/results.tgz" bench/results
say "all done"
