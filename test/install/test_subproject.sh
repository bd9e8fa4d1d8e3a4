#!/bin/sh
# shardopt as a subproject, the way README.md ("Use it in your project") tells a user: a
# project with subprojects/shardopt.wrap copied in and `dependency('shardopt')`. Here the
# wrap's directory is a symlink to this source tree (meson then uses it without cloning).
# Configures that project (no build: the library build is what install_pkgconfig proves)
# and checks that the dependency comes from the wrap and that no test suite, hence no
# GoogleTest, is looked for.
# Usage: test_subproject.sh SOURCE_ROOT CONSUMER_CPP
set -eu
root="$1"
src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/app/subprojects"
cp "$root/subprojects/shardopt.wrap" "$tmp/app/subprojects/"
ln -s "$root" "$tmp/app/subprojects/shardopt"
cp "$src" "$tmp/app/app.cpp"
cat >"$tmp/app/meson.build" <<'MESON'
project('app', 'cpp', default_options: ['cpp_std=c++20'])
shardopt_dep = dependency('shardopt', default_options: ['bench=false', 'examples=false'])
executable('app', 'app.cpp', dependencies: [shardopt_dep, dependency('mpi', language: 'cpp')])
MESON
if ! meson setup "$tmp/build" "$tmp/app" >"$tmp/setup.log" 2>&1; then
  cat "$tmp/setup.log"; exit 1
fi
log="$tmp/build/meson-logs/meson-log.txt"
grep -q "Subproject shardopt finished" "$log" || { cat "$tmp/setup.log"; echo "FAIL: shardopt was not configured as a subproject"; exit 1; }
grep -q "Dependency shardopt for host machine found: YES" "$log" || { cat "$tmp/setup.log"; echo "FAIL: dependency('shardopt') not found through the wrap"; exit 1; }
if grep -qi "gtest" "$log"; then
  grep -i "gtest" "$log"; echo "FAIL: the subproject looked for GoogleTest (tests must be off in a subproject)"; exit 1
fi
echo "ok: dependency('shardopt') through subprojects/shardopt.wrap; the subproject builds no tests and needs no GoogleTest"
