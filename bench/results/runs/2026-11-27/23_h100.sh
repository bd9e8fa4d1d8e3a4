#!/usr/bin/env bash
# Call 23 (2026-11-27, third session; one GPU): the rest of d1's proof, which call 22's shared
# lanes did not finish: the single-GPU suites (one-rank MPI suites included), memcheck of the
# suites that run the in-place MXFP8 gather at one rank, and bench_dist_adam at one rank
# (MXFP8 / NVFP4 / bf16 steps and iterations, ratios within the process).
#   bash bench/results/runs/2026-11-27/23_h100.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || say "build phase exit $?"
say "build: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
timeout 120 mpirun --allow-run-as-root -n 1 build-gpu/bench/bench_dist_adam --results "$OUT/r_n1" >"$OUT/bench_n1.txt" 2>&1
say "bench_dist_adam n1: exit $?"
grep -hE '^\{"bench": "dist_adam_(step|iteration)"' "$OUT/bench_n1.txt" | grep -o '"config": "[^"]*"\|"ours_ms": [0-9.e-]*\|"[a-z_]*over_bf16[a-z_]*": [0-9.]*' | paste -sd' ' | sed 's/"config"/\n  n1:/g' >>"$L"; echo >>"$L"
mkdir -p "$OUT/T"; OUT="$OUT/T" timeout 330 bash scripts/device_suite.sh tests1 >/dev/null 2>&1
say "tests1 exit $?: $(grep -h 'gpu tests' "$OUT/T/summary.txt")"; grep -h 'FAIL\|TIMEOUT' "$OUT/T/summary.txt" | tee -a "$L"
mkdir -p "$OUT/S"; SAN_ONLY='mxfp8_params|optimizer_sequence|distributed_adam|checkpoint' OUT="$OUT/S" timeout 200 bash scripts/device_suite.sh sanitize >/dev/null 2>&1
say "sanitize (SAN_ONLY mxfp8_params|optimizer_sequence|distributed_adam|checkpoint) exit $?"; grep -h 'sanitize\|memcheck\|racecheck\|synccheck' "$OUT/S/summary.txt" | tee -a "$L"
cp "$OUT/T/summary.txt" "$OUT/tests1_summary.txt"; cp "$OUT/S/summary.txt" "$OUT/sanitize_summary.txt" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" T S build bench_n1.txt r_n1 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name 'logs.tgz' ! -name lanes.log ! -name '*_summary.txt' ! -name bench_n1.txt -exec rm -rf {} +
say "all done"
