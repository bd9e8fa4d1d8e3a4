#!/usr/bin/env bash
# The README's main command: builds shardopt and runs its main job.
# Until the example trainer lands this is the layout report of a Llama-3.2-1B-shaped
# model at world sizes 1, 2, 4 and 8.
#   bash scripts/run_main.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
shardopt_deps
build="${BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dcuda-arch="${CUDA_ARCH:-90}"
fi
ninja -C "$build" examples/layout_report
"$build/examples/layout_report" 1 2 4 8
