// FastDivider against the hardware's integer division: every divisor up to 4096 and
// the divisors around each power of two up to 2^31 - 1, each with the dividends where
// a quotient changes (multiples of d and their neighbours), the ends of the range and
// random dividends.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/fast_divide.hpp"

namespace {

using shardopt::FastDivider;
using shardopt::make_divider;

constexpr std::uint32_t kMaxDividend = 0x7FFFFFFFu;

// Dividends to try for divisor d: 0..3, the ends, k*d - 1, k*d, k*d + 1 for small k and
// for k near the top of the range, and random ones.
std::vector<std::uint32_t> dividends(std::uint32_t d, std::mt19937& rng) {
  std::vector<std::uint32_t> n = {0, 1, 2, 3, kMaxDividend, kMaxDividend - 1};
  const std::uint64_t top = kMaxDividend / d;
  for (std::uint64_t k : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{3}, top / 2, top - 1, top}) {
    for (std::int64_t delta : {-1, 0, 1}) {
      const std::int64_t v = static_cast<std::int64_t>(k * d) + delta;
      if (v >= 0 && v <= kMaxDividend) n.push_back(static_cast<std::uint32_t>(v));
    }
  }
  std::uniform_int_distribution<std::uint32_t> any(0, kMaxDividend);
  for (int i = 0; i < 64; ++i) n.push_back(any(rng));
  return n;
}

void expect_exact(std::uint32_t d, std::mt19937& rng) {
  const FastDivider f = make_divider(d);
  for (std::uint32_t n : dividends(d, rng)) {
    ASSERT_EQ(f.divide(n), n / d) << n << " / " << d << " (magic " << f.magic << ", shift " << f.shift << ")";
  }
}

TEST(FastDivide, EveryDivisorUpTo4096) {
  std::mt19937 rng(1);
  for (std::uint32_t d = 1; d <= 4096; ++d) expect_exact(d, rng);
}

TEST(FastDivide, DivisorsAroundEveryPowerOfTwo) {
  std::mt19937 rng(2);
  for (int k = 1; k <= 31; ++k) {
    const std::int64_t p = std::int64_t{1} << k;
    for (std::int64_t d = p - 3; d <= p + 3; ++d) {
      if (d >= 1 && d <= kMaxDividend) expect_exact(static_cast<std::uint32_t>(d), rng);
    }
  }
}

TEST(FastDivide, RandomLargeDivisors) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> any(1, kMaxDividend);
  for (int i = 0; i < 2000; ++i) expect_exact(any(rng), rng);
}

TEST(FastDivide, DividesEverySmallDividendExactly) {
  // Exhaustive over n < 2^20 for the tile counts the MXFP8 kernels divide by.
  for (std::uint32_t d : {1u, 3u, 16u, 64u, 1002u, 4008u, 16032u}) {
    const FastDivider f = make_divider(d);
    for (std::uint32_t n = 0; n < (1u << 20); ++n) ASSERT_EQ(f.divide(n), n / d) << n << " / " << d;
  }
}

}  // namespace
