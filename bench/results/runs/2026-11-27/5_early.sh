#!/usr/bin/env bash
# Early call of the session of 2026-11-27 (01:50 UTC start), on landed main 88f8f0c:
#   1. ncu of the MXFP8 owned pass and the NVFP4 amax pass inside bench_dist_adam --phases (1 rank)
#   2. issue 35: the GPT peer comparison (device_suite gpt phase, 300 steps, 1 and 2 GPUs)
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"
say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
bash scripts/device_suite.sh build || { say "build failed"; tail -30 "$OUT/build.log"; exit 1; }
say "build done"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
say "ncu: $NCU"
for k in "regex:shard_kernel" "regex:nvfp4|amax" ; do
  timeout 150 "$NCU" --clock-control none -k "$k" --launch-skip 2 --launch-count 3 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section SourceCounters \
    build-gpu/bench/bench_dist_adam --phases --iters 3 >>"$OUT/ncu.txt" 2>&1
  say "ncu $k exit $?"
done
GPT_STEPS=300 GPT_DATA=.dev_data/shakespeare timeout $((590 - SECONDS)) bash scripts/device_suite.sh gpt
say "gpt exit $?"
cp /tmp/gpt_*.jsonl "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" bench/results "$OUT"/*.png "$OUT"/gpt_*.jsonl "$OUT/ncu.txt" "$OUT/bench.log" "$OUT/summary.txt" 2>/dev/null
say "all done"
