#!/usr/bin/env bash
# Final proof, call A (4 GPUs): build the merged tree; then at once
#   lane S: the whole sanitize gate on GPU 3 (memcheck, racecheck, synccheck)
#   lane B: the single-GPU suites on GPU 0
#   lane F: the fault cases and the 4-rank suites (all GPUs)
#   lane M: the 2-rank suites (all GPUs)
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"; git log --oneline -1 | tee -a "$L"
bash scripts/device_suite.sh build || { say "build failed"; tail -40 "$OUT/build.log"; exit 1; }
say "build done"
cuobjdump --dump-resource-usage build-gpu/src/libshardopt.so 2>/dev/null | grep -B1 -E 'STACK:[1-9]' | grep -oE 'Function [^ :]+' | sed 's/Function //' | c++filt | cut -c1-160 | sed 's/^/kernel with a stack frame: /' | tee -a "$L"
meson test -C build-gpu --list --suite gpu-multi 2>/dev/null | sed 's/.*shardopt://' > "$OUT/multi.list"
F=$(grep -E '_n4|fault' "$OUT/multi.list" | tr '\n' ' ')
M=$(grep -vE '_n4|fault' "$OUT/multi.list" | tr '\n' ' ')
( CUDA_VISIBLE_DEVICES=3 SAN_JOBS=8 timeout 440 bash scripts/device_suite.sh sanitize >"$OUT/laneS.txt" 2>&1; echo "[$SECONDS s] lane S exit $?" >>"$OUT/laneS.txt" ) &
S=$!
( CUDA_VISIBLE_DEVICES=0 timeout 430 meson test -C build-gpu --no-rebuild --print-errorlogs --suite gpu --num-processes 2 \
    --timeout-multiplier 0.5 --logbase laneB >"$OUT/laneB.txt" 2>&1; echo "[$SECONDS s] lane B exit $?" >>"$OUT/laneB.txt" ) &
B=$!
( timeout 440 meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 1 --timeout-multiplier 0.5 \
    --logbase laneF $F >"$OUT/laneF.txt" 2>&1; echo "[$SECONDS s] lane F exit $?" >>"$OUT/laneF.txt" ) &
Fp=$!
( timeout 440 meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 1 --timeout-multiplier 0.5 \
    --logbase laneM $M >"$OUT/laneM.txt" 2>&1; echo "[$SECONDS s] lane M exit $?" >>"$OUT/laneM.txt" ) &
Mp=$!
sumline() { grep -E '^(Ok|Fail|Skipped|Timeout|Expected Fail|Unexpected Pass):' "$1" | tr -s ' ' | tr '\n' ' '; }
wait $B; say "lane B (gpu suite, GPU 0) done: $(sumline "$OUT/laneB.txt")"
wait $Mp; say "lane M (2-rank suites) done: $(sumline "$OUT/laneM.txt")"
wait $Fp; say "lane F (faults + 4-rank suites) done: $(sumline "$OUT/laneF.txt")"
wait $S; say "lane S done: $(grep -E 'sanitize: ' "$OUT/laneS.txt" | tail -1)"
grep -hE '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|INTERRUPT)' "$OUT"/lane[BFM].txt | sort -u | tee -a "$L"
grep -E '^(FAIL|fail)' "$OUT/laneS.txt" | head -20 | tee -a "$L"
for f in laneB laneF laneM; do cp "build-gpu/meson-logs/$f.txt" "$OUT/$f.testlog.txt" 2>/dev/null; done
gzip -f "$OUT"/*.testlog.txt 2>/dev/null
say "all done"
