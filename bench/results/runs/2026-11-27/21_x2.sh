#!/usr/bin/env bash
# Call 21 (2026-11-27, third session): does landed main have the sequence hazard that hung
# branch c1? gpu_mpi_optimizer_sequence (cherry-picked from c1, 64b6784) on main, each case in
# its own mpirun (a hang poisons the CUDA context of the rest), bounded by timeout.
#   bash bench/results/runs/2026-11-27/21_x2.sh   (on 2 GPUs, tree = main + the test)
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
M="mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2"
nvidia-smi -L | tee -a "$L"
{ meson setup build-gpu -Dcuda-arch=90 -Dbuildtype=release >/dev/null 2>&1 &&
  ninja -C build-gpu test/gpu_mpi_optimizer_sequence >"$OUT/build.txt" 2>&1; } ||
  { say "build failed"; tail -20 "$OUT/build.txt" | tee -a "$L"; exit 1; }
say "build done"
for t in FourGroups EightGroups FourGroupsUnregistered FourGroupsFreshCommunicator; do
  timeout 200 $M build-gpu/test/gpu_mpi_optimizer_sequence --gtest_filter="OptimizerSequenceGpu.$t" >"$OUT/seq_$t.txt" 2>&1
  say "$t: exit $?"; sed 's/\x1b\[[0-9;]*m//g' "$OUT/seq_$t.txt" | grep -E "^\[ *(OK|FAILED) " | sort -u | tee -a "$L"
done
say "all done"
