// main() of the single-process GPU suites: exit code 77 (meson's "skipped") when no
// CUDA device is usable, so CI machines without a GPU skip cleanly.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/float_env.hpp"
#include "shardopt/backend.hpp"

int main(int argc, char** argv) {
  if (!shardopt::cuda_compiled() || shardopt::cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping the GPU suite\n");
    return 77;
  }
  // The tests' oracles compute with IEEE subnormals, as the GPU and the host twins do,
  // even where a library loaded by this process turned flush-to-zero on (-ffast-math).
  if (shardopt::detail::subnormals_flushed())
    std::printf("note: this process started with subnormals flushed (FTZ/DAZ); the tests run with IEEE subnormals\n");
  const shardopt::detail::IeeeSubnormals ieee;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
