#!/usr/bin/env bash
# Call 9 (nvidia-h100-x1, the H100 the sanitize gate of issue 29 asks for), on main: build,
# the README main command on one GPU (issue 35; matplotlib from the carried .whl/mpl when the
# device lacks it: no network there), then the whole sanitize gate (SAN_JOBS=8).
#   bash bench/results/runs/2026-11-27/9_h100.sh   (carry: .dev_data, .whl)
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
nvidia-smi -L | tee -a "$L"
python3 -c 'import matplotlib' 2>/dev/null || { python3 -m pip install -q --no-index --find-links .whl/mpl matplotlib 2>&1 ||
  python3 -m pip install -q --break-system-packages --no-index --find-links .whl/mpl matplotlib; } 2>&1 | tail -2 | tee -a "$L"
python3 -c 'import matplotlib; print("matplotlib", matplotlib.__version__)' 2>&1 | tee -a "$L"
bash scripts/device_suite.sh build >/dev/null || { say "build failed"; tail -40 "$OUT/build.log" | tee -a "$L"; exit 1; }
say "build done"; grep -h "build ok\|BUILD" "$OUT/summary.txt" | tee -a "$L"
PLOT="$OUT/run_main_loss.png" DATA=.dev_data/shakespeare BUILD_DIR=build-gpu timeout 200 bash scripts/run_main.sh >"$OUT/main.txt" 2>&1
say "run_main exit $?"; grep -E "val|resume|same|png|sample|step +1000|final" "$OUT/main.txt" | tail -14 | tee -a "$L"
SAN_JOBS=8 timeout $((590 - SECONDS)) bash scripts/device_suite.sh sanitize >/dev/null; say "sanitize exit $?"
grep -hE "sanitize" "$OUT/summary.txt" | tail -70 >>"$L"
tar czf "$OUT/results.tgz" "$OUT"/*.log "$OUT"/*.txt 2>/dev/null
find "$OUT" -maxdepth 1 -type f ! -name results.tgz ! -name lanes.log ! -name summary.txt ! -name run_main_loss.png -delete
say "all done"
