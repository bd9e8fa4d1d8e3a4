#!/bin/sh
# Python reads what C++ wrote: the C++ checkpoint test writes a checkpoint from 2 ranks
# and the expected tensors as .npy (SHARDOPT_CKPT_OUT), then the checkpoint tool's test
# verifies, lists and assembles every tensor and compares them with those arrays; the
# same for an NVFP4 optimizer's checkpoint and its NVFP4 planes.
# Usage: run_cpp_checkpoint.sh MPIEXEC CHECKPOINT_TEST PYTHON3 TEST_CKPT_TOOL_PY
set -eu
mpiexec="$1" exe="$2" python="$3" script="$4"
"$python" -c 'import numpy, safetensors' 2>/dev/null || { echo "numpy or safetensors missing: skipped"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
SHARDOPT_CKPT_OUT="$out" "$mpiexec" -n 2 --oversubscribe --bind-to none -x SHARDOPT_CKPT_OUT \
  "$exe" --gtest_filter='*WriteForPython*'
[ -f "$out/ckpt/index.json" ] || { echo "the C++ test wrote no checkpoint into $out/ckpt"; exit 1; }
SHARDOPT_CKPT_DIR="$out/ckpt" SHARDOPT_CKPT_EXPECT="$out/expect" "$python" "$script"
# The NVFP4 checkpoint: verify (every nvfp4_data byte exactly once) and its planes.
[ -f "$out/ckpt_nvfp4/index.json" ] || { echo "the C++ test wrote no NVFP4 checkpoint into $out/ckpt_nvfp4"; exit 1; }
SHARDOPT_CKPT_DIR="$out/ckpt_nvfp4" SHARDOPT_CKPT_EXPECT="$out/expect_nvfp4" "$python" "$script"
