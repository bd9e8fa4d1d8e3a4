#!/bin/sh
# Builds the example trainer the way an outside project would: against an installed
# shardopt found through pkg-config (no project include paths), with MPI from mpicxx.
# With nvcc and cuBLAS (WITH_CUDA=1, default when nvcc is on PATH) the CUDA ops are
# compiled too; otherwise the trainer runs on the host backend only. CLI11 (libcli11-dev,
# header-only) parses the options: scripts/deps.sh installs it.
#   PKG_CONFIG_PATH=<prefix>/lib/pkgconfig sh build_with_pkgconfig.sh OUTPUT [CUDA_ARCH]
set -eu
out="$1"
arch="${2:-90}"
here=$(cd "$(dirname "$0")" && pwd)
cxx="${CXX:-c++}"
flags=$(pkg-config --cflags --libs shardopt)
mpi_compile=$(mpicxx --showme:compile 2>/dev/null || echo "")
mpi_link=$(mpicxx --showme:link 2>/dev/null || echo "-lmpi")
with_cuda="${WITH_CUDA:-$(command -v nvcc >/dev/null 2>&1 && echo 1 || echo 0)}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sources="cli.cpp config.cpp gpt_model.cpp host_ops.cpp model.cpp model_spec.cpp text_data.cpp trainer.cpp weights.cpp
  main.cpp"
cuda_objs=""
cuda_libs=""
if [ "$with_cuda" = 1 ]; then
  for cu in "$here"/cuda_*.cu; do  # CudaOps: cuda_ops.cu and one file per op family
    obj="$tmp/$(basename "$cu" .cu).o"
    nvcc -std=c++20 --expt-relaxed-constexpr -fmad=false -O3 -gencode=arch=compute_${arch},code=sm_${arch} \
      -Xcompiler=-fPIC $(pkg-config --cflags shardopt) -c "$cu" -o "$obj"
    cuda_objs="$cuda_objs $obj"
  done
  cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
  cuda_libs="-L$cuda_home/lib64 -lcublas -lcudart"
else
  sources="$sources cuda_ops_none.cpp"
fi
# shellcheck disable=SC2086
(cd "$here" && $cxx -std=c++20 -O2 -DOMPI_SKIP_MPICXX=1 $mpi_compile $sources $cuda_objs $flags $cuda_libs \
  $mpi_link -o "$out")
echo "built $out (CUDA ops: $with_cuda)"
