#!/bin/sh
# Runs one fault scenario of mpi_fault_cases on N ranks under `timeout` and passes only
# when every rank but the faulty last one printed PASS and the job ended by itself (no
# hang: `timeout` would end it with 124). mpiexec's orte_allowed_exit_without_sync lets
# the other ranks live on when the faulty rank exits without MPI_Finalize (by default
# mpiexec kills the whole job at once, which would hide the timeout under test).
# Usage: run_fault.sh MPIEXEC N BINARY SCENARIO TIMEOUT_MS   (SHARDOPT_BACKEND=host|cuda)
mpiexec="$1"; n="$2"; exe="$3"; scenario="$4"; ms="$5"
# With SHARDOPT_BACKEND=cuda (the GPU registration): one GPU per rank, NCCL, multicast off.
if [ "${SHARDOPT_BACKEND:-}" = cuda ]; then
  gpus=0
  if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then  # a lane of a larger machine: only its GPUs count
    visible=$(printf '%s\n' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    [ "$visible" -lt "$gpus" ] && gpus=$visible
  fi
  if [ "$gpus" -lt "$n" ]; then echo "needs $n GPUs, found $gpus: skipping"; exit 77; fi
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
fi
# Sanitized runs: OpenMPI's blocks behind an abandoned collective are expected here, and
# only here (test/sanitize/lsan_faults.supp says why).
case "${LSAN_OPTIONS:-}" in
  *suppressions=*)
    supp="$(cd "$(dirname "$0")/../sanitize" && pwd)/lsan_faults.supp"
    LSAN_OPTIONS=$(printf '%s' "$LSAN_OPTIONS" | sed "s|suppressions=[^:]*|suppressions=$supp|")
    export LSAN_OPTIONS;;
esac
# The deadline, the job's start-up and teardown, with room for a slow shared machine.
limit=$(( ms / 1000 * 3 + 60 ))
# The output goes to a file as it comes, so that a job ended by `timeout` still shows
# how far each rank got.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$mpiexec" -n "$n" --oversubscribe --bind-to none \
  --mca orte_allowed_exit_without_sync 1 "$exe" "$scenario" "$ms" >"$log" 2>&1 &
job=$!
waited=0
while kill -0 "$job" 2>/dev/null && [ "$waited" -lt "$limit" ]; do sleep 1; waited=$((waited + 1)); done
if kill -0 "$job" 2>/dev/null; then
  # A hang: each rank prints its main thread's stack (SIGUSR1), then the job is ended.
  # (not this script, whose own command line holds the same words: USR1 would end it
  # before it printed anything)
  ranks=$(pgrep -f -- "$exe $scenario $ms" | grep -v -x -e "$$" -e "$job" || true)
  for p in $ranks; do kill -USR1 "$p" 2>/dev/null; done
  sleep 3
  kill -TERM "$job" $ranks 2>/dev/null; sleep 5; kill -KILL "$job" $ranks 2>/dev/null
  wait "$job" 2>/dev/null
  rc=124
else
  wait "$job"
  rc=$?
fi
out=$(cat "$log")
printf '%s\n' "$out"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "run_fault: '$scenario' still running after ${limit} s: a rank hangs"
  exit 1
fi
passes=$(printf '%s\n' "$out" | grep -c "^PASS $scenario rank ")
if [ "$rc" -ne 0 ] || [ "$passes" -ne $(( n - 1 )) ]; then
  echo "run_fault: '$scenario' exit status $rc, $passes of $(( n - 1 )) live ranks passed"
  exit 1
fi
echo "run_fault: '$scenario' passed on the $(( n - 1 )) live ranks of $n"
