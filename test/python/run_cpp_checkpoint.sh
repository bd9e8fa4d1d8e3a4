#!/bin/sh
# Python reads what C++ wrote: the C++ checkpoint test writes a checkpoint from 2 ranks
# and the expected tensors as .npy (SHARDOPT_CKPT_OUT), then the checkpoint tool's test
# verifies, lists and assembles every tensor and compares them with those arrays; the
# same for an NVFP4 optimizer's checkpoint and its NVFP4 planes; and an Fsdp checkpoint of
# MXFP8 parameters reads as the same tensors (every kind) as a DistributedAdam's of the
# same state. With MUON_CHECKPOINT_TEST, a checkpoint of an optimizer with Muon groups and
# each matrix's momentum after one step, computed by the C++ test.
# Usage: run_cpp_checkpoint.sh MPIEXEC CHECKPOINT_TEST PYTHON3 TEST_CKPT_TOOL_PY [MUON_CHECKPOINT_TEST]
set -eu
mpiexec="$1" exe="$2" python="$3" script="$4" muon_exe="${5:-}"
"$python" -c 'import numpy, safetensors' 2>/dev/null || { echo "numpy or safetensors missing: skipped"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
SHARDOPT_CKPT_OUT="$out" "$mpiexec" -n 2 --oversubscribe --bind-to none -x SHARDOPT_CKPT_OUT \
  "$exe" --gtest_filter='*WriteForPython*'
[ -f "$out/ckpt/index.json" ] || { echo "the C++ test wrote no checkpoint into $out/ckpt"; exit 1; }
# Each run checks only the C++ checkpoint (SHARDOPT_CKPT_ENV_ONLY): the tool's own checks
# on the checkpoints it writes itself are the test ckpt_tool's.
SHARDOPT_CKPT_ENV_ONLY=1 SHARDOPT_CKPT_DIR="$out/ckpt" SHARDOPT_CKPT_EXPECT="$out/expect" "$python" "$script"
# The NVFP4 checkpoint: verify (every nvfp4_data byte exactly once) and its planes.
[ -f "$out/ckpt_nvfp4/index.json" ] || { echo "the C++ test wrote no NVFP4 checkpoint into $out/ckpt_nvfp4"; exit 1; }
SHARDOPT_CKPT_ENV_ONLY=1 SHARDOPT_CKPT_DIR="$out/ckpt_nvfp4" SHARDOPT_CKPT_EXPECT="$out/expect_nvfp4" "$python" "$script"
# Fsdp + MXFP8: verify, then every tensor of every kind equals the DistributedAdam one.
for d in ckpt_fsdp_mxfp8 ckpt_da_mxfp8; do
  [ -f "$out/$d/index.json" ] || { echo "the C++ test wrote no checkpoint into $out/$d"; exit 1; }
done
SHARDOPT_CKPT_DIR="$out/ckpt_fsdp_mxfp8" SHARDOPT_CKPT_SAME_AS="$out/ckpt_da_mxfp8" "$python" "$script"
# Muon: verify (muon_momentum F32, whole per matrix, no Adam moments beside it) and values.
if [ -n "$muon_exe" ]; then
  SHARDOPT_CKPT_OUT="$out" "$mpiexec" -n 2 --oversubscribe --bind-to none -x SHARDOPT_CKPT_OUT \
    "$muon_exe" --gtest_filter='*WriteMuonForPython*'
  [ -f "$out/ckpt_muon/index.json" ] || { echo "the C++ test wrote no Muon checkpoint into $out/ckpt_muon"; exit 1; }
  SHARDOPT_CKPT_ENV_ONLY=1 SHARDOPT_CKPT_DIR="$out/ckpt_muon" SHARDOPT_CKPT_EXPECT="$out/expect_muon" "$python" "$script"
fi
