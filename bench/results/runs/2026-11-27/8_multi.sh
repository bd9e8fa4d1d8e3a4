#!/usr/bin/env bash
# Final two-GPU call (nvidia-h100-x2 asked), merged tree: build, every gpu-multi suite, the
# one-GPU suites call 7 left failing or unrun, then (time allowing) the F32Accumulate
# comm bench at 256 MiB and the two-rank dist-Adam phases.
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
bash scripts/device_suite.sh build >/dev/null; rc=$?
say "build exit $rc: $(grep -h 'build' "$OUT/summary.txt" | tail -1)"
[ -x build-gpu/test/gpu_adam ] || { tail -40 "$OUT/build.log" | tee -a "$L"; exit 1; }
B=build-gpu; M="mpirun --allow-run-as-root --oversubscribe --bind-to none"
timeout $((330 - SECONDS)) meson test -C $B --no-rebuild --print-errorlogs --suite gpu-multi --num-processes 1 \
  --timeout-multiplier 0.25 --logbase multi >"$OUT/multi.txt" 2>&1; say "gpu-multi exit $?"
grep -E "^ *[0-9]+/[0-9]+ " "$OUT/multi.txt" | sort -u | cut -c1-110 >>"$L"
timeout $((450 - SECONDS)) meson test -C $B --no-rebuild --print-errorlogs --num-processes 1 --timeout-multiplier 0.25 \
  --logbase single gpu_mpi_kernel_preload_dist_adam_n1 gpu_mpi_kernel_preload_fsdp_n1 gpu_mpi_muon_n1 \
  gpu_trainer_gpt_ops gpu_mpi_trainer_gpt_n1 gpu_mpi_trainer_n1 >"$OUT/single.txt" 2>&1; say "single exit $?"
grep -E "^ *[0-9]+/[0-9]+ " "$OUT/single.txt" | sort -u | cut -c1-110 >>"$L"
if [ $SECONDS -lt 470 ]; then
  NCCL_DEBUG=WARN timeout 40 $M -n 2 $B/bench/bench_comm --f32-accumulate --sizes-mib 256 --iters 10 --wait-timeout-s 30 \
    --results bench/results >"$OUT/comm.txt" 2>&1; say "bench_comm f32acc exit $?"; grep -E '^\{' "$OUT/comm.txt" | cut -c1-500 >>"$L"
fi
if [ $SECONDS -lt 500 ]; then
  timeout 45 $M -n 2 $B/bench/bench_dist_adam --phases --iters 10 --results bench/results >"$OUT/ph.txt" 2>&1
  say "phases n2 exit $?"; grep -E '^\{"bench": "dist_adam_step' "$OUT/ph.txt" | cut -c1-300 >>"$L"
fi
tar czf "$OUT/results.tgz" bench/results "$OUT"/*.txt "$OUT"/*.log $B/meson-logs/*.txt 2>/dev/null
find "$OUT" -maxdepth 1 -type f ! -name results.tgz ! -name lanes.log ! -name summary.txt -delete
say "all done"
