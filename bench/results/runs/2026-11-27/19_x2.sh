#!/usr/bin/env bash
# Call 19 (2 GPUs): why call 18's bench_dist_adam hung with helper c1's pipelined tail at the
# default 4 pipeline groups (and not at 8), and the pipeline depth alone on main. Two builds
# at once: build-gpu (this tree, main without c1: bench_dist_adam) and /tmp/var (this tree +
# 19_c1.patch, c1's merge: bench_dist_adam and the gpu_mpi_pipelined_tail test). Then: main
# at 4 and 8 groups; c1 at 4 groups under a watch (past 45 s the ranks' host stacks,
# cuda-gdb, go to tail_gp4.hang); c1's test at 2 ranks; main at 4 and 8 groups again.
#   bash bench/results/runs/2026-11-27/19_x2.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
watched() {  # LIMIT NAME BIN CMD...
  local limit="$1" name="$2" bin="$3"; shift 3
  "$@" >"$OUT/$name.txt" 2>&1 &
  local job=$! w=0
  while kill -0 "$job" 2>/dev/null && [ "$w" -lt "$limit" ]; do sleep 1; w=$((w + 1)); done
  if ! kill -0 "$job" 2>/dev/null; then wait "$job"; say "$name exit $? ($w s)"; return; fi
  for p in $(pgrep -f "$bin" | grep -v "^$job$"); do
    [ "$(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | head -1)" = "$bin" ] || continue
    { echo "-- $p"; timeout 25 /usr/local/cuda/bin/cuda-gdb -p "$p" -batch -ex 'thread apply all bt' 2>&1 |
        grep -E '^(Thread |#)' | grep -v libcudadebugger | head -80; } >>"$OUT/$name.hang"
  done
  pkill -KILL -f "$bin"; kill -KILL "$job" 2>/dev/null; wait "$job" 2>/dev/null
  say "$name HUNG after $limit s (stacks in $name.hang)"
}
rows() { grep -hE '^\{"bench": "dist_adam_(step|iteration)"' "$1" | grep -o '"config": "[^"]*"\|"device": "[^"]*"\|"ours_ms": [0-9.e-]*\|"[a-z_]*over_bf16[a-z_]*": [0-9.]*' | paste -sd' ' | sed "s/\"config\"/\n  $2:/g" >>"$L"; echo >>"$L"; }
nvidia-smi -L | tee -a "$L"
rm -rf /tmp/var && mkdir /tmp/var && cp -r $(ls -A | grep -v '^build') /tmp/var/ &&
  (cd /tmp/var && patch -p1 <bench/results/runs/2026-11-27/19_c1.patch >/dev/null) || { say "variant tree failed"; exit 1; }
( cd /tmp/var && meson setup build -Dcuda-arch=90 -Dbuildtype=release >/dev/null 2>&1 &&
  ninja -C build bench/bench_dist_adam test/gpu_mpi_pipelined_tail >build.log 2>&1; echo "[$SECONDS s] c1 build exit $?" >>"$L" ) &
{ meson setup build-gpu -Dcuda-arch=90 -Dbuildtype=release >/dev/null 2>&1 && ninja -C build-gpu bench/bench_dist_adam >"$OUT/build.txt" 2>&1; } || { say "main build failed"; tail "$OUT/build.txt"; }
say "main build done"; wait; say "builds done"
mkdir -p "$OUT/r_main4" "$OUT/r_main8" "$OUT/r_c1"
run_main() {  # round, groups
  timeout 60 $MPIRUN -n 2 build-gpu/bench/bench_dist_adam --gather-pipeline "$2" --results "$OUT/r_main$2" >"$OUT/main$2_$1.txt" 2>&1
  say "main, $2 groups, round $1: exit $?"; rows "$OUT/main$2_$1.txt" "main gp$2 r$1"
}
run_main 1 4; run_main 1 8
NCCL_DEBUG=WARN watched 45 tail_gp4 /tmp/var/build/bench/bench_dist_adam $MPIRUN -x NCCL_DEBUG -n 2 /tmp/var/build/bench/bench_dist_adam --results "$OUT/r_c1"
rows "$OUT/tail_gp4.txt" "c1 gp4"
SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda timeout 60 $MPIRUN -x SHARDOPT_TEST_NEEDS_GPU -x SHARDOPT_BACKEND -n 2 \
  /tmp/var/build/test/gpu_mpi_pipelined_tail >"$OUT/tail_test_n2.txt" 2>&1
say "gpu_mpi_pipelined_tail at 2 ranks exit $?"; sed 's/\x1b\[[0-9;]*m//g' "$OUT/tail_test_n2.txt" | grep -E "^\[ *(OK|FAILED|PASSED|SKIPPED) " | sort | uniq -c | tee -a "$L"
run_main 2 4; run_main 2 8
tar czf "$OUT/results.tgz" "$OUT"/r_* "$OUT"/*.txt "$OUT"/*.hang 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name lanes.log -exec rm -rf {} +
say "all done"
