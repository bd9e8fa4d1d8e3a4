#!/usr/bin/env bash
# The README's test command: installs what it needs, builds shardopt and runs every
# test suite (unit, mpi on the host backend, install; gpu tests run on GPUs and are
# skipped with exit code 77 where there is none).
#   bash scripts/test.sh [extra meson test arguments]
# Environment: BUILD_DIR (default build), CUDA_ARCH (default 90).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
shardopt_deps
build="${BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dcuda-arch="${CUDA_ARCH:-90}"
fi
ninja -C "$build"
meson test -C "$build" --print-errorlogs "$@"
