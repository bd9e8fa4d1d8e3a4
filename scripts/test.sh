#!/usr/bin/env bash
# The README's test command: installs what it needs, builds shardopt and runs every
# test suite (unit, mpi on the host backend, install; gpu tests run on GPUs and are
# skipped with exit code 77 where there is none).
#   bash scripts/test.sh [extra meson test arguments]
# Environment: BUILD_DIR (default build, or build-san with SANITIZE), CUDA_ARCH (default 90),
#   SANITIZE    e.g. address,undefined: a host-only build (-Dcuda=disabled; compute-sanitizer
#               checks the GPU code, scripts/device_suite.sh sanitize) with meson's
#               b_sanitize, every suite run with ASan/UBSan halting on the first error.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
shardopt_deps
# Warnings are errors, in the normal and the sanitized builds alike.
setup=(-Dcuda-arch="${CUDA_ARCH:-90}" -Dwerror=true)
if [ -n "${SANITIZE:-}" ]; then
  build="${BUILD_DIR:-build-san}"
  # -O1 -g: the sanitizers' usual setting (readable stacks, quick to build).
  # -fno-sanitize-recover=all: every UBSan check aborts, whatever UBSAN_OPTIONS says.
  # b_lundef=false: meson's default -Wl,--no-undefined does not mix with sanitizers.
  setup+=(-Dcuda=disabled -Db_sanitize="$SANITIZE" -Db_lundef=false -Doptimization=1 -Ddebug=true
          -Dcpp_args="-fno-omit-frame-pointer -fno-sanitize-recover=all")
  here=$(pwd)
  # Read by every test process, mpiexec's ranks included (OpenMPI passes its whole
  # environment to local ranks). Leak detection is on; test/sanitize/lsan.supp lists the
  # leaks of OpenMPI's own startup and teardown, each with the reason, and needs
  # fast_unwind_on_malloc=0 (OpenMPI has no frame pointers: the fast unwinder stops in
  # its plugins, which are unloaded by the time leaks are reported).
  export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:${ASAN_OPTIONS:-}"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
  export LSAN_OPTIONS="suppressions=$here/test/sanitize/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
else
  build="${BUILD_DIR:-build}"
fi
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "${setup[@]}"
else
  meson configure "$build" -Dwerror=true  # a build directory set up before warnings were errors
fi
# The normal build builds everything (every program compiles, benchmarks included); the
# sanitized one only what its tests run (meson-test-prereq: the test programs and what
# their arguments name), since benchmarks without a smoke test never run there.
if [ -n "${SANITIZE:-}" ]; then ninja -C "$build" meson-test-prereq; else ninja -C "$build"; fi
# The sanitized run leaves out the many-rank suite (64 ASan processes do not fit this
# machine's memory and time; docs/multinode.md) and the suites that run Python alone
# (python, lint: no C++ program in them): the normal run covers them. (A sanitized build
# does not register the many-rank suite either: test/mpi/meson.build.)
skip=()
if [ -n "${SANITIZE:-}" ]; then skip=(--no-suite manyrank --no-suite python --no-suite lint); fi
meson test -C "$build" --print-errorlogs "${skip[@]}" "$@"
