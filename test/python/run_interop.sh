#!/bin/sh
# Usage: run_interop.sh UNIT_SAFETENSORS_BINARY PYTHON CHECK_SCRIPT
# Writes the interop file with the C++ unit test, then reads it back with Python's
# safetensors. Exit 0 pass, 1 fail, 77 skip (numpy or safetensors missing).
set -u
bin=$1
python=$2
script=$3
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
out="$dir/interop.safetensors"
SHARDOPT_INTEROP_OUT="$out" "$bin" --gtest_filter='*Interop*' || exit 1
"$python" "$script" "$out"
