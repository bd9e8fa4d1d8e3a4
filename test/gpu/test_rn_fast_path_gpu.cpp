// The fast paths of sqrtf and / without their per-call branch (kernels/common/
// rn_fast_path.cuh, what the 8-bit Adam pass interleaves over a lane's elements) equal the
// compiler's sqrtf and / bit for bit wherever they say they are exact, and say so exactly
// on their documented ranges: every float for the square root; every divisor significand,
// each with 64 random dividends, exponents over the whole range and one binade past it,
// for the division.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/memory.hpp"
#include "rn_fast_path_kernels.hpp"

namespace {
using namespace shardopt;

std::string first(const rn_fast_path_test::Sweep& s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "first at bits 0x%08x / 0x%08x", s.first_a, s.first_b);
  return buf;
}

TEST(GpuRnFastPath, SquareRootEqualsSqrtfOnEveryFloat) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const rn_fast_path_test::Sweep s = rn_fast_path_test::sqrt_sweep(0u, 0xFFFFFFFFu);
  EXPECT_EQ(s.checked, 1ull << 32);
  EXPECT_EQ(s.wrong_results, 0ull) << first(s);
  EXPECT_EQ(s.wrong_flags, 0ull) << first(s);
}

TEST(GpuRnFastPath, DivisionEqualsTheDivisionOverItsRange) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const rn_fast_path_test::Sweep s = rn_fast_path_test::div_sweep(64, -60, 60, 20261202);
  EXPECT_EQ(s.checked, (1ull << 23) * 66);
  EXPECT_EQ(s.wrong_results, 0ull) << first(s);
  EXPECT_EQ(s.wrong_flags, 0ull) << first(s);
}

}  // namespace
