// main() of the single-process GPU suites: exit code 77 (meson's "skipped") when no
// CUDA device is usable, so CI machines without a GPU skip cleanly.
#include <gtest/gtest.h>

#include <cstdio>

#include "shardopt/backend.hpp"

int main(int argc, char** argv) {
  if (!shardopt::cuda_compiled() || shardopt::cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping the GPU suite\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
