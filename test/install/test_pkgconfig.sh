#!/bin/sh
# Installs the built library into a temporary root, then compiles and runs a tiny
# outside program against it through pkg-config only (no project include paths).
# Usage: test_pkgconfig.sh BUILD_DIR CONSUMER_CPP [SANITIZE]
# SANITIZE: the build's b_sanitize (e.g. address,undefined; none or empty for none). A
# sanitized libshardopt.so needs a consumer linked with the same sanitizer runtimes.
set -eu
build="$1"
src="$2"
sanitize="${3:-none}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log"; exit 1; }
pc=$(find "$tmp/root" -name shardopt.pc | head -n 1)
[ -n "$pc" ] || { echo "shardopt.pc was not installed"; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
export PKG_CONFIG_SYSROOT_DIR="$tmp/root"
flags=$(pkg-config --cflags --libs shardopt)
echo "pkg-config shardopt: $flags"
san_flags=
if [ -n "$sanitize" ] && [ "$sanitize" != none ]; then
  san_flags="-fsanitize=$sanitize -fno-sanitize-recover=all"
  echo "sanitizers: $san_flags"
fi
${CXX:-c++} -std=c++20 $san_flags "$src" $flags -o "$tmp/consumer"
libdir=$(dirname "$(find "$tmp/root" -name 'libshardopt.so' | head -n 1)")
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" SHARDOPT_BACKEND=host "$tmp/consumer"
