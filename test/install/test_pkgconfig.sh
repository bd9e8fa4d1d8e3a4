#!/bin/sh
# The outside build: installs the built library into a temporary root, then compiles a
# tiny program against it with `pkg-config --cflags --libs shardopt` alone (no project
# include paths, no mpicxx: shardopt.pc's Requires bring MPI, and in a CUDA build the CUDA
# runtime) and runs it under mpiexec at 2 ranks on the host backend.
# Usage: test_pkgconfig.sh BUILD_DIR CONSUMER_CPP [SANITIZE] [MPIEXEC] [CUDA]
# SANITIZE: the build's b_sanitize (e.g. address,undefined; none or empty for none). A
# sanitized libshardopt.so needs a consumer linked with the same sanitizer runtimes.
# CUDA: 1 when the build has the CUDA backend (the consumer then calls the CUDA runtime).
set -eu
build="$1"
src="$2"
sanitize="${3:-none}"
mpiexec="${4:-mpiexec}"
cuda="${5:-0}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log"; exit 1; }
pc=$(find "$tmp/root" -name shardopt.pc | head -n 1)
[ -n "$pc" ] || { echo "shardopt.pc was not installed"; exit 1; }
# The installed file names the configured prefix; point it at the temporary root (what a
# real install to that prefix gives). Only shardopt.pc changes: the MPI .pc it requires is
# the system's, found on pkg-config's own path.
prefix=$(sed -n 's/^prefix=//p' "$pc")
sed -i "s|^prefix=.*|prefix=$tmp/root$prefix|" "$pc"
export PKG_CONFIG_PATH="$(dirname "$pc")"
echo "shardopt.pc:"; sed 's/^/  /' "$pc"
flags=$(pkg-config --cflags --libs shardopt)
echo "pkg-config --cflags --libs shardopt: $flags"
extra=
if [ -n "$sanitize" ] && [ "$sanitize" != none ]; then
  extra="-fsanitize=$sanitize -fno-sanitize-recover=all"
  echo "sanitizers: $extra"
fi
if [ "$cuda" = 1 ]; then extra="$extra -DCONSUMER_CUDA=1"; fi
# shellcheck disable=SC2086
${CXX:-c++} -std=c++20 $extra "$src" $flags -o "$tmp/consumer"
# The run finds the shared libraries where the link found them (-L: shardopt's, CUDA's).
for d in $(pkg-config --libs-only-L shardopt); do
  LD_LIBRARY_PATH="${d#-L}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
"$mpiexec" -n 2 --oversubscribe --bind-to none "$tmp/consumer"
