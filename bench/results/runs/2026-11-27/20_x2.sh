#!/usr/bin/env bash
# Call 20 (2026-11-27, third session), run on branch c1 (88bc5d3) on 2 x H200: the pipelined
# tail's hang at 4 groups told apart (NCCL_GRAPH_REGISTER=0, 4 and 8 groups, the sequence
# test, the tail test). The gp8 run failed at once: c1 predates --gather-pipeline.
#   bash bench/results/runs/2026-11-27/20_x2.sh   (tree = branch c1)
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
M="mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2"
nvidia-smi -L | tee -a "$L"
{ meson setup build-gpu -Dcuda-arch=90 -Dbuildtype=release >/dev/null 2>&1 &&
  ninja -C build-gpu bench/bench_dist_adam test/gpu_mpi_optimizer_sequence test/gpu_mpi_pipelined_tail >"$OUT/build.txt" 2>&1; } ||
  { say "build failed"; tail -20 "$OUT/build.txt" | tee -a "$L"; exit 1; }
say "build done"
bench() {  # name, extra env var assignment or "", extra bench args...
  local name="$1" envv="$2"; shift 2
  local x=(); [ -n "$envv" ] && x=(-x "${envv%%=*}")
  timeout 120 env $envv $M "${x[@]}" build-gpu/bench/bench_dist_adam --results "$OUT/r_$name" "$@" >"$OUT/$name.txt" 2>&1
  say "bench $name: exit $?"
  grep -hE '^\{"bench": "dist_adam_(step|iteration)"' "$OUT/$name.txt" | grep -o '"config": "[^"]*"\|"ours_ms": [0-9.e-]*\|"[a-z_]*over_bf16[a-z_]*": [0-9.]*' | paste -sd' ' | sed "s/\"config\"/\n  $name:/g" >>"$L"; echo >>"$L"
}
mkdir -p "$OUT"/r_gp4 "$OUT"/r_gp4_noreg "$OUT"/r_gp8
bench gp4_noreg NCCL_GRAPH_REGISTER=0
bench gp4 ""
bench gp8 "" --gather-pipeline 8
timeout 300 $M build-gpu/test/gpu_mpi_optimizer_sequence >"$OUT/sequence.txt" 2>&1
say "gpu_mpi_optimizer_sequence exit $?"; sed 's/\x1b\[[0-9;]*m//g' "$OUT/sequence.txt" | grep -E "^\[ *(OK|FAILED|PASSED) " | tee -a "$L"
SHARDOPT_TEST_NEEDS_GPU=1 timeout 60 $M -x SHARDOPT_TEST_NEEDS_GPU build-gpu/test/gpu_mpi_pipelined_tail >"$OUT/tail.txt" 2>&1
say "gpu_mpi_pipelined_tail exit $?"; sed 's/\x1b\[[0-9;]*m//g' "$OUT/tail.txt" | grep -E "^\[ *(OK|FAILED|PASSED) " | tee -a "$L"
tar czf "$OUT/results.tgz" "$OUT"/r_* "$OUT"/*.txt 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name lanes.log -exec rm -rf {} +
say "all done"
