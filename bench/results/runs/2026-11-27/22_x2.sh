#!/usr/bin/env bash
# Call 22 (2026-11-27, third session; 2 GPUs: no 4-GPU kind was lent at the time): helper d1's
# in-place MXFP8 gather (issue 29) proven and measured. Tree = main + d1; /tmp/base = the same tree with
# 22_d1.patch reversed (landed main's library and bench), built in the call beside it.
#   first, alone on the GPUs: bench_dist_adam at 2 ranks, d1 then main (default 4 pipeline groups),
#   then d1 --phases; then at once: the gpu-multi suite at 2 ranks (meson logbase "multi") and the
#   single-GPU suites on GPU 0 (logbase "single").
#   bash bench/results/runs/2026-11-27/22_x2.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
M="mpirun --allow-run-as-root --oversubscribe --bind-to none"
D=bench/results/runs/2026-11-27
nvidia-smi -L | tee -a "$L"
rm -rf /tmp/base && mkdir -p /tmp/base && cp -r $(ls -A | grep -v '^build') /tmp/base/ &&
  (cd /tmp/base && patch -s -R -p1 <"$D/22_d1.patch") || { say "base patch failed"; exit 1; }
( cd /tmp/base && meson setup build-gpu -Dcuda-arch=90 -Dbuildtype=release -Dtests=false -Dexamples=false >/dev/null &&
  ninja -C build-gpu bench/bench_dist_adam ) >"$OUT/base_build.txt" 2>&1 &
BB=$!
OUT="$OUT/build" bash scripts/device_suite.sh build >/dev/null 2>&1 || say "build phase exit $?"
say "build: $(grep -h 'build ok\|BUILD' "$OUT/build/summary.txt")"
wait $BB; say "base build exit $?"
rows() { grep -hE '^\{"bench": "dist_adam_(step|iteration)"' "$1" | grep -o '"config": "[^"]*"\|"ours_ms": [0-9.e-]*\|"[a-z_]*over_bf16[a-z_]*": [0-9.]*' | paste -sd' ' | sed "s/\"config\"/\n  $2:/g" >>"$L"; echo >>"$L"; }
bench() {  # name, tree, ranks, extra args...
  local name="$1" tree="$2" n="$3"; shift 3
  mkdir -p "$OUT/r_$name"
  (cd "$tree" && timeout 150 $M -n "$n" build-gpu/bench/bench_dist_adam --results "$OUT/r_$name" "$@") >"$OUT/$name.txt" 2>&1
  say "bench $name: exit $?"; rows "$OUT/$name.txt" "$name"
}
mkdir -p "$OUT/A" "$OUT/B"
bench d1_n2_a . 2
bench main_n2 /tmp/base 2
bench d1_n2_phases . 2 --phases
# The test lanes share the GPUs (tests only, no timing): gpu-multi on both, the single-GPU suites on GPU 0.
( CUDA_VISIBLE_DEVICES=0,1 MESON_LOGBASE=multi OUT="$OUT/A" timeout 400 bash scripts/device_suite.sh testsN >/dev/null 2>&1
  say "lane A (0,1 testsN) exit $?: $(grep -h 'gpu tests' "$OUT/A/summary.txt")"; grep -h 'FAIL\|TIMEOUT' "$OUT/A/summary.txt" | tee -a "$L" ) &
LA=$!
( CUDA_VISIBLE_DEVICES=0 MESON_LOGBASE=single OUT="$OUT/B" timeout 380 bash scripts/device_suite.sh tests1 >/dev/null 2>&1
  say "lane B (0 tests1) exit $?: $(grep -h 'gpu tests' "$OUT/B/summary.txt")"; grep -h 'FAIL\|TIMEOUT' "$OUT/B/summary.txt" | tee -a "$L" ) &
LB=$!
wait $LA $LB
tar czf "$OUT/logs.tgz" -C "$OUT" A B build $(cd "$OUT" && ls -d *.txt r_*) 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name 'logs.tgz' ! -name lanes.log -exec rm -rf {} +
say "all done"
