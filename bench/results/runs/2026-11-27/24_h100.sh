#!/usr/bin/env bash
# Call 24 (2026-11-27, fourth session; prepared by the third): issue 29's last unmeasured deliverable,
# the FSDP iteration at ONE rank against both peers (FSDP2 and Megatron-FSDP 0.6.1), bf16 and
# MXFP8 (earlier calls ran the fsdp phase with FSDP_ONE=0: rows exist at 2 and 4 ranks only);
# then the five single-GPU suites that call 23 did not reach on main + d1 (the in-place MXFP8
# gather): gpu_muon_torch_check, gpu_trainer_ops, gpu_trainer_gpt_ops, gpu_mpi_trainer_n1,
# gpu_mpi_trainer_gpt_n1.
# One GPU (nvidia-h100-x1 or nvidia-h200), carry [".whl"] (megatron-fsdp + einops wheels):
#   bash bench/results/runs/2026-11-27/24_h100.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
  export PYTHONPATH=/tmp/site
nvidia-smi -L | tee "$OUT/lanes.log"
bash scripts/device_suite.sh build >/dev/null 2>&1 || { echo "build failed"; tail -40 "$OUT/build.log"; exit 1; }
timeout 400 bash scripts/device_suite.sh fsdp >/dev/null 2>&1; echo "fsdp phase (1 rank) exit $?" | tee -a "$OUT/lanes.log"
grep -hE 'megatron|== fsdp|^\{"bench": "fsdp_iteration"' "$OUT/summary.txt" | cut -c1-400 | tee -a "$OUT/lanes.log"
timeout $((590 - SECONDS)) meson test -C build-gpu --no-rebuild --print-errorlogs --logbase rest gpu_muon_torch_check gpu_trainer_ops \
  gpu_trainer_gpt_ops gpu_mpi_trainer_n1 gpu_mpi_trainer_gpt_n1 >"$OUT/rest_tests.txt" 2>&1
echo "the five suites: exit $?" | tee -a "$OUT/lanes.log"
sed 's/\x1b\[[0-9;]*m//g' build-gpu/meson-logs/rest.txt | grep -E '^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):' | tee -a "$OUT/lanes.log"
tar czf "$OUT/logs.tgz" -C "$OUT" bench.log rest_tests.txt -C "$PWD/build-gpu/meson-logs" rest.txt 2>/dev/null
echo "[$SECONDS s] all done" | tee -a "$OUT/lanes.log"
