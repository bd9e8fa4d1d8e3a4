#!/usr/bin/env bash
# Final single-GPU call (nvidia-h100-x1: the H100 the sanitize gate of issue 29 asks for), on the
# merged tree. PART=1: build, the gpu suite, the one-GPU benches (adam, mxfp8, nvfp4, phases,
# muon if built). PART=2: the README main command on one GPU, then the sanitize gate (SAN_JOBS=8).
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
bash scripts/device_suite.sh build >/dev/null || { say "build failed"; tail -40 "$OUT/build.log" | tee -a "$L"; exit 1; }
say "build done"
if [ "${PART:-1}" = 1 ]; then
  timeout 330 bash scripts/device_suite.sh tests1 >/dev/null; say "tests1 exit $?"
  grep -hE "gpu tests|FAIL|TIMEOUT" "$OUT/summary.txt" | tail -15 | tee -a "$L"
  ph="adam mxfp8 nvfp4 phases"; grep -q '^phase_muon()' scripts/device_suite.sh && ph="$ph muon"
  timeout $((520 - SECONDS)) bash scripts/device_suite.sh $ph >/dev/null; say "benches ($ph) exit $?"
else
  DATA=.dev_data/shakespeare BUILD_DIR=build-gpu timeout 150 bash scripts/run_main.sh >"$OUT/main.txt" 2>&1
  say "run_main exit $?"; grep -E "val loss|resume|same|PNG|png|sample" "$OUT/main.txt" | tail -8 | tee -a "$L"
  SAN_JOBS=8 timeout $((585 - SECONDS)) bash scripts/device_suite.sh sanitize >/dev/null; say "sanitize exit $?"
  grep -hE "sanitize" "$OUT/summary.txt" | tail -60 >>"$L"
fi
grep -hE '^\{"bench"' "$OUT/summary.txt" 2>/dev/null | cut -c1-600 >>"$L"
tar czf "$OUT/results.tgz" bench/results "$OUT"/*.log "$OUT"/*.txt 2>/dev/null
find "$OUT" -maxdepth 1 -type f ! -name results.tgz ! -name lanes.log ! -name summary.txt -delete
say "all done"
