#!/usr/bin/env bash
# Final two-GPU call (nvidia-h100-x2 asked), on the merged tree: build, every gpu-multi suite,
# then the two-rank benches: dist-Adam step and phases, the F32Accumulate reduce, Muon if built.
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
bash scripts/device_suite.sh build >/dev/null || { say "build failed"; tail -40 "$OUT/build.log" | tee -a "$L"; exit 1; }
say "build done"
timeout 300 bash scripts/device_suite.sh testsN >/dev/null; say "testsN exit $?"
grep -hE "gpu tests|FAIL|TIMEOUT" "$OUT/summary.txt" | tail -15 | tee -a "$L"
ph="phases reduce"; grep -q '^phase_muon()' scripts/device_suite.sh && ph="$ph muon"
timeout $((585 - SECONDS)) bash scripts/device_suite.sh $ph >/dev/null; say "benches ($ph) exit $?"
grep -hE '^\{"bench"' "$OUT/summary.txt" 2>/dev/null | cut -c1-600 >>"$L"
tar czf "$OUT/results.tgz" bench/results "$OUT"/*.log "$OUT"/*.txt 2>/dev/null
find "$OUT" -maxdepth 1 -type f ! -name results.tgz ! -name lanes.log ! -name summary.txt -delete
say "all done"
