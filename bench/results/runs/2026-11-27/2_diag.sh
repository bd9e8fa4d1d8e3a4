#!/usr/bin/env bash
# Short 4-GPU diagnosis: the fault hangs at 4 ranks (with stacks), the reshard fix at 4
# ranks, and the lazy-loading hypothesis for the F32Accumulate warm-up hang.
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
bash scripts/device_suite.sh build >/dev/null 2>&1 || { say "build failed"; tail -30 "$OUT/build.log"; exit 1; }
say "build done"
ninja -C build-gpu test/mpi_fault_cases test/gpu_mpi_checkpoint >/dev/null 2>&1
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
( SHARDOPT_BACKEND=cuda SHARDOPT_TEST_NEEDS_GPU=1 sh test/mpi/run_fault.sh mpirun 4 build-gpu/test/mpi_fault_cases skip_fsdp 5000 >"$OUT/fault_fsdp.txt" 2>&1; echo "exit $?" >>"$OUT/fault_fsdp.txt" ) &
F=$!
( CUDA_VISIBLE_DEVICES=2,3 CUDA_MODULE_LOADING=EAGER timeout -s KILL 60 $MPIRUN -n 2 build-gpu/bench/bench_comm --f32-accumulate --sizes-mib 64 --iters 2 --warmup 1 >"$OUT/eager.txt" 2>&1; echo "exit $?" >>"$OUT/eager.txt" ) &
E=$!
wait $F; say "skip_fsdp n4: $(tail -2 "$OUT/fault_fsdp.txt" | tr '\n' ' ')"
( SHARDOPT_BACKEND=cuda SHARDOPT_TEST_NEEDS_GPU=1 sh test/mpi/run_fault.sh mpirun 4 build-gpu/test/mpi_fault_cases skip_hsdp 5000 >"$OUT/fault_hsdp.txt" 2>&1; echo "exit $?" >>"$OUT/fault_hsdp.txt" ) &
H=$!
wait $E; say "f32acc 64 MiB with CUDA_MODULE_LOADING=EAGER: $(tail -1 "$OUT/eager.txt")"
wait $H; say "skip_hsdp n4: $(tail -2 "$OUT/fault_hsdp.txt" | tr '\n' ' ')"
SHARDOPT_TEST_NEEDS_GPU=1 SHARDOPT_BACKEND=cuda timeout 150 $MPIRUN -n 4 build-gpu/test/gpu_mpi_checkpoint --gtest_brief=1 >"$OUT/ckpt4.txt" 2>&1
say "gpu_mpi_checkpoint n4: exit $? $(grep -E 'PASSED|FAILED' "$OUT/ckpt4.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ' ')"
say "all done"
