#!/usr/bin/env bash
# Installs what building and testing shardopt needs on a Debian/Ubuntu machine, as
# root, skipping whatever is already there: a C++20 compiler, pkg-config, OpenMPI,
# GoogleTest, nlohmann/json, CLI11 (apt), meson + ninja and numpy + safetensors (pip).
# Sourced by scripts/test.sh and scripts/run_main.sh; run_main.sh also calls shardopt_plot_deps
# (matplotlib, for its loss curve). CUDA and NCCL are used when present, never installed.
#
# Offline (the GPU machine has no network): CLI11, the example trainer's option parser, is
# header-only and comes from a Debian package kept in .deb/ at the repository root
# (git-ignored; fill it once on a machine with the network: `mkdir -p .deb && cd .deb &&
# apt-get download libcli11-dev`, and carry it with the tree). When the header is missing
# and apt cannot install it, shardopt_cli11 (below; shardopt_deps calls it) unpacks that
# package: `dpkg -x .deb/libcli11-dev_*.deb /`.
set -euo pipefail

shardopt_deps() {
  local pkgs=()
  command -v g++ >/dev/null 2>&1 || pkgs+=(g++)
  command -v pkg-config >/dev/null 2>&1 || pkgs+=(pkg-config)
  command -v mpiexec >/dev/null 2>&1 || pkgs+=(openmpi-bin)
  { [ -f /usr/include/mpi.h ] || [ -d /usr/lib/x86_64-linux-gnu/openmpi/include ] || command -v mpicxx >/dev/null 2>&1; } \
    || pkgs+=(libopenmpi-dev)
  [ -f /usr/include/gtest/gtest.h ] || pkgs+=(libgtest-dev)
  # The JSON parser of the library (meson finds it through pkg-config; without it meson
  # would fetch subprojects/nlohmann_json.wrap, which needs the network).
  [ -f /usr/include/nlohmann/json.hpp ] || pkgs+=(nlohmann-json3-dev)
  # CLI11 parses the example trainer's options (examples/trainer/cli.cpp).
  [ -f /usr/include/CLI/CLI.hpp ] || pkgs+=(libcli11-dev)
  command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
  python3 -m pip --version >/dev/null 2>&1 || pkgs+=(python3-pip)
  command -v ninja >/dev/null 2>&1 || pkgs+=(ninja-build)
  if [ ${#pkgs[@]} -gt 0 ]; then
    echo "deps: apt-get install ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if [ "${pkgs[*]}" = libcli11-dev ]; then
      shardopt_cli11  # apt may have no network here (the GPU machine): the package in .deb/
    else
      apt-get update -q
      apt-get install -y -q --no-install-recommends "${pkgs[@]}"
    fi
  fi
  # meson >= 1.3 from pip (Debian 12 ships 1.0).
  if ! meson --version 2>/dev/null | awk -F. '{exit !($1 > 1 || ($1 == 1 && $2 >= 3))}'; then
    echo "deps: pip install meson"
    python3 -m pip install -q meson ninja 2>/dev/null \
      || python3 -m pip install -q --break-system-packages meson ninja
    hash -r
  fi
  # numpy + safetensors for the checkpoint tool and its tests (tools/shardopt_ckpt.py).
  if ! python3 -c 'import numpy, safetensors' >/dev/null 2>&1; then
    echo "deps: pip install numpy safetensors"
    python3 -m pip install -q numpy safetensors 2>/dev/null \
      || python3 -m pip install -q --break-system-packages numpy safetensors
  fi
  # nvcc and NCCL live under /usr/local/cuda on the CI and GPU machines.
  if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  # OpenMPI refuses to start as root unless told; tests run as root in containers.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# CLI11, when its header is missing: apt, or where apt cannot install it (no network: the
# GPU machine) the Debian package kept in .deb/ (see the top of this file), unpacked with
# dpkg -x. scripts/device_suite.sh's build phase calls it too.
shardopt_cli11() {
  [ -f /usr/include/CLI/CLI.hpp ] && return 0
  export DEBIAN_FRONTEND=noninteractive
  if { apt-get update -q && apt-get install -y -q --no-install-recommends libcli11-dev; } >/dev/null 2>&1 \
      && [ -f /usr/include/CLI/CLI.hpp ]; then
    echo "deps: apt-get install libcli11-dev"
    return 0
  fi
  local root deb
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  deb=$(compgen -G "$root/.deb/libcli11-dev_*.deb" | sort | tail -1 || true)
  if [ -z "$deb" ]; then
    echo "deps: no CLI11: apt cannot install libcli11-dev and there is no .deb/libcli11-dev_*.deb" >&2
    return 1
  fi
  echo "deps: dpkg -x $deb / (CLI11, apt could not install it)"
  dpkg -x "$deb" /
}

# matplotlib for scripts/run_main.sh's loss curve and scripts/plot_results.py's pictures
# (the tests do not need it).
shardopt_plot_deps() {
  if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
    echo "deps: pip install matplotlib"
    python3 -m pip install -q matplotlib 2>/dev/null \
      || python3 -m pip install -q --break-system-packages matplotlib
  fi
}
