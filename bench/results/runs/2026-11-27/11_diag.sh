#!/usr/bin/env bash
# Call 11 (nvidia-h100-x2), issue 31's hang, on main + test/gpu/test_store_sequence_gpu.cpp:
# does a store built after another store in the same process stall (the benchmark's order)?
# Does NCCL's buffer registration matter (NCCL_LOCAL_REGISTER=0)? Then the torch Muon check
# (issue 34) on GPU 0.
#   bash bench/results/runs/2026-11-27/11_diag.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
nvidia-smi -L | tee -a "$L"; git log --oneline -1 2>/dev/null | tee -a "$L"
meson setup build-gpu -Dcuda-arch=90 -Dbuildtype=release -Dwerror=true >"$OUT/build.log" 2>&1
ninja -C build-gpu bench/bench_dist_adam test/gpu_mpi_store_sequence test/python/muon_torch_run >>"$OUT/build.log" 2>&1 ||
  { say "build failed"; grep -B2 -A12 -m3 "error" "$OUT/build.log" | tee -a "$L"; exit 1; }
say "build done"
# watched LIMIT NAME BIN CMD...: runs CMD (an mpirun job) in the background; past LIMIT s, the
# main threads' stacks of its rank processes (cuda-gdb) go to $OUT/NAME.hang, then it is killed.
watched() {
  local limit="$1" name="$2" bin="$3"; shift 3
  local left=$((550 - SECONDS)); [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -ge 20 ] || { say "$name skipped: no time left"; return; }
  "$@" >"$OUT/$name.txt" 2>&1 &
  local job=$! w=0
  while kill -0 "$job" 2>/dev/null && [ "$w" -lt "$limit" ]; do sleep 1; w=$((w + 1)); done
  if ! kill -0 "$job" 2>/dev/null; then wait "$job"; say "$name exit $? ($w s)"; return; fi
  for p in $(pgrep -f "$bin" | grep -v "^$job$"); do
    [ "$(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | head -1)" = "$bin" ] || continue
    { echo "-- $p"; timeout 40 /usr/local/cuda/bin/cuda-gdb -p "$p" -batch -ex 'thread apply all bt' 2>&1 |
        grep -E '^(Thread 1 |#)' | grep -A30 '^Thread 1 ' | head -30; } >>"$OUT/$name.hang"
  done
  pkill -KILL -f "$bin"; kill -KILL "$job" 2>/dev/null; wait "$job" 2>/dev/null
  say "$name HUNG after $limit s (stacks in $name.hang)"
}
( CUDA_VISIBLE_DEVICES=0 timeout 240 python3 bench/peers/muon_torch_check.py --exe build-gpu/test/python/muon_torch_run >"$OUT/muon_torch.txt" 2>&1
  say "gpu_muon_torch_check exit $? (beside the 2-rank runs)"; tail -25 "$OUT/muon_torch.txt" >>"$L" ) &
export NCCL_DEBUG=WARN
watched 120 seq build-gpu/test/gpu_mpi_store_sequence $MPIRUN -n 2 build-gpu/test/gpu_mpi_store_sequence
grep -E "^\[ *(OK|FAILED|RUN) |Timeout|error" "$OUT/seq.txt" | head -20 | tee -a "$L"
NCCL_LOCAL_REGISTER=0 watched 100 seq_noreg build-gpu/test/gpu_mpi_store_sequence $MPIRUN -x NCCL_LOCAL_REGISTER -n 2 build-gpu/test/gpu_mpi_store_sequence
grep -E "^\[ *(OK|FAILED) " "$OUT/seq_noreg.txt" | head -10 | tee -a "$L"
if grep -q "^\[  PASSED  \] 2 tests" "$OUT/seq.txt"; then  # the test did not reproduce it: does the bench still hang?
  watched 150 dist build-gpu/bench/bench_dist_adam $MPIRUN -n 2 build-gpu/bench/bench_dist_adam --grad-reduce-precision --results bench/results
  grep -E '^\{"bench"' "$OUT/dist.txt" | cut -c1-600 | tee -a "$L"
fi
NCCL_LOCAL_REGISTER=0 watched 150 dist_noreg build-gpu/bench/bench_dist_adam $MPIRUN -x NCCL_LOCAL_REGISTER -n 2 build-gpu/bench/bench_dist_adam --grad-reduce-precision --results bench/results
grep -E '^\{"bench"' "$OUT/dist_noreg.txt" | cut -c1-600 | tee -a "$L"
wait
tar czf "$OUT/results.tgz" bench/results "$OUT"/*.txt "$OUT"/*.hang "$OUT"/build.log 2>/dev/null
say "all done"
