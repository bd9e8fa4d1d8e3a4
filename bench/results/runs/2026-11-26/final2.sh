#!/usr/bin/env bash
# Second proof call: the fixes after final.sh (Tree variants, NCCL's 16-byte over-read
# under memcheck), then the reduce benchmark (issue 31) and the warm-up race check (issue 30).
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
L="$OUT/lanes.log"
say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
bash scripts/device_suite.sh build || { say "build failed"; exit 1; }
say "build done"
meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 1 gpu_mpi_grad_reduce_n2 gpu_mpi_grad_reduce_n2_ring \
  gpu_mpi_grad_reduce_n2_tree gpu_mpi_grad_reduce_opt_n2 gpu_mpi_grad_reduce_opt_n2_ring gpu_mpi_grad_reduce_opt_n2_tree >"$OUT/tests.txt" 2>&1
say "grad_reduce tests: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$OUT/tests.txt" | tr -s ' ' | tr '\n' ' ')"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
timeout 110 env SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda $MPIRUN -n 2 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --report-api-errors no build-gpu/test/gpu_mpi_grad_reduce --gtest_filter='GradReduceGpu.AllToAll*:GradReduceGpu.PieceSum*:GradReduceGpu.StoreBf16*' \
  >"$OUT/memcheck.txt" 2>&1
say "memcheck gpu_mpi_grad_reduce n2 (all-to-all, piece sum, bf16 store): exit $?; $(grep -E 'ERROR SUMMARY|PASSED|FAILED  \]' "$OUT/memcheck.txt" | tr -s ' ' | tr '\n' ' ')"
if [ $SECONDS -lt 230 ]; then
  timeout 75 $MPIRUN -n 2 build-gpu/bench/bench_comm --f32-accumulate --sizes-mib 64,256,1024 --iters 10 --results bench/results >"$OUT/bench.txt" 2>&1
  say "bench_comm exit $?"; grep -hE '^\{"bench"' "$OUT/bench.txt" | tee -a "$L"
fi
if [ $SECONDS -lt 300 ]; then
  timeout 60 $MPIRUN -n 2 build-gpu/bench/bench_dist_adam --grad-reduce-precision --iters 20 --results bench/results >>"$OUT/bench.txt" 2>&1
  say "bench_dist_adam --grad-reduce-precision exit $?"; grep -hE '^\{"bench":"dist_adam_grad' "$OUT/bench.txt" | tee -a "$L"
fi
if [ $SECONDS -lt 320 ]; then
  cp .dev_final/step_graph_old.cpp src/optimizer/step_graph.cpp
  timeout 40 ninja -C build-gpu test/gpu_mpi_step_graph_stream >/dev/null 2>&1
  SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda timeout 30 $MPIRUN -n 2 build-gpu/test/gpu_mpi_step_graph_stream >"$OUT/oldsg.txt" 2>&1
  say "issue 30: the OLD step_graph.cpp at 2 GPUs: exit $? (non-zero expected)"; grep -E '^\[  (FAILED|PASSED) ' "$OUT/oldsg.txt" | sort -u | tee -a "$L"
fi
tar czf "$OUT/results.tgz" bench/results
say "all done"
