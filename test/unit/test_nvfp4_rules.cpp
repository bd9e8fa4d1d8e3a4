// The NVFP4 rules of docs/nvfp4.md that a reader could otherwise only guess, each pinned
// on the host backend through the public calls, with the expected bytes derived by hand
// from the rules (the derivation is in each test's comments; nothing here asks the code
// under test or its oracle for an expected value).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace {
using namespace shardopt;
using namespace nvfp4_test;
namespace ref = nvfp4_ref;

constexpr Backend kHost = Backend::Host;

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// bf16 of a value that bf16 holds exactly (all values below are such).
std::uint16_t bf16_exact(float f) {
  const std::uint32_t u = bits_of(f);
  EXPECT_EQ(u & 0xFFFFu, 0u) << f << " is not a bf16 value";
  return static_cast<std::uint16_t>(u >> 16);
}
int code_at(const ref::Quantized& q, std::int64_t i) {
  return (q.data[static_cast<std::size_t>(i / 2)] >> (4 * (i % 2))) & 0xF;
}

TEST(Nvfp4Rules, BlockScaleProductOfExactlyTwoToMinusTenRoundsToZero) {
  // Tensor amax 448: S_enc = 2688 / 448 = 6 exactly, and fl32(6 * fl32(1/6)) = 1 (fl32(1/6)
  // = 11184811 * 2^-26; times 6 is 1 + 2^-25, which rounds to 1). So a block's scale is
  // e4m3(block_amax) itself. The smallest E4M3 subnormal is 2^-9; 2^-10 is the midpoint
  // between 0 and it, and the tie goes to the even code 0x00. The next bf16 above 2^-10
  // rounds up to 2^-9, code 0x01.
  ASSERT_EQ(6.0f * (1.0f / 6.0f), 1.0f);
  const Nvfp4Shape s{16, 48};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[0] = bf16_exact(448.0f);
  x[16] = bf16_exact(std::ldexp(1.0f, -10));                       // block 1: the tie
  x[32] = bf16_exact(std::ldexp(1.0f, -10) * (1.0f + 1.0f / 128));  // block 2: one bf16 step above
  const ref::Quantized q = quantize_on(kHost, s, x);
  EXPECT_EQ(q.amax, bits_of(448.0f));
  EXPECT_EQ(q.scale[1], 0x00) << "exactly 2^-10 is at or below the threshold: scale 0";
  EXPECT_EQ(q.scale[2], 0x01) << "above 2^-10: the smallest subnormal 2^-9";
  // Scale 0: the multiplier is min(1 / 0, FLT_MAX) = FLT_MAX, so 2^-10 saturates to 6.
  EXPECT_EQ(code_at(q, 16), 0x7);
}

TEST(Nvfp4Rules, NegativeZeroIsCode8AndTheAmaxOfZerosIsPlusZero) {
  // All elements -0: amax = max |x| = +0 (bits 0), so S_enc = S_dec = 1, every block
  // scale e4m3(0) = 0, every multiplier FLT_MAX, and each element -0 * FLT_MAX = -0:
  // code 0x8, two per byte: 0x88.
  const Nvfp4Shape s{17, 19};
  const std::vector<std::uint16_t> neg(static_cast<std::size_t>(s.numel()), 0x8000);
  ref::Quantized q = quantize_on(kHost, s, neg);
  EXPECT_EQ(q.amax, 0u) << "amax +0, not -0";
  EXPECT_EQ(q.decode_scale, bits_of(1.0f));
  for (std::uint8_t b : q.scale) EXPECT_EQ(b, 0x00);
  for (std::size_t k = 0; k + 1 < q.data.size(); ++k) ASSERT_EQ(q.data[k], 0x88) << k;
  EXPECT_EQ(q.data.back(), 0x08) << "odd numel: the last high nibble is 0";
  // +0 and -0 alternating: +0 gives 0x0 (low nibbles), -0 gives 0x8 (high nibbles).
  std::vector<std::uint16_t> mixed(static_cast<std::size_t>(s.numel()), 0);
  for (std::size_t i = 1; i < mixed.size(); i += 2) mixed[i] = 0x8000;
  q = quantize_on(kHost, s, mixed);
  EXPECT_EQ(q.amax, 0u);
  for (std::size_t k = 0; k + 1 < q.data.size(); ++k) ASSERT_EQ(q.data[k], 0x80) << k;
  // In a nonzero tensor too: -0 keeps its sign whatever the multiplier.
  std::vector<std::uint16_t> some(static_cast<std::size_t>(s.numel()), 0x8000);
  some[5] = bf16_exact(3.0f);
  q = quantize_on(kHost, s, some);
  EXPECT_EQ(q.amax, bits_of(3.0f));
  EXPECT_EQ(code_at(q, 0), 0x8);
  EXPECT_EQ(code_at(q, 4), 0x8);
  // The sharded path, from fp32 masters of -0 split over two ranks at an odd offset.
  const std::vector<float> master(static_cast<std::size_t>(s.numel()), -0.0f);
  std::string problems;
  const ref::Quantized sh = simulate(kHost, s, master, {0, 101, s.numel()}, &problems);
  EXPECT_EQ(problems, "");
  EXPECT_EQ(sh.amax, 0u);
  for (std::size_t k = 0; k + 1 < sh.data.size(); ++k) ASSERT_EQ(sh.data[k], 0x88) << k;
}

TEST(Nvfp4Rules, TheLargestBf16AmaxGivesAPositiveEncodeScale) {
  // Rule 2's "S_enc == 0" guard is never reached by a finite bf16 amax: the largest,
  // 0x7F7F = (2 - 2^-7) * 2^127, gives 2688 / amax ~ 7.93e-36, a normal fp32. S_dec is
  // then fl32(1 / that), not the guard's 1.
  const Nvfp4Shape s{16, 16};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[3] = 0x7F7F;
  const double amax = std::ldexp(2.0 - std::ldexp(1.0, -7), 127);
  const auto s_enc = static_cast<float>(2688.0 / amax);  // one rounding of the exact quotient
  ASSERT_TRUE(std::isnormal(s_enc));
  const ref::Quantized q = quantize_on(kHost, s, x);
  EXPECT_EQ(q.amax, 0x7F7F0000u);
  EXPECT_EQ(q.decode_scale, bits_of(static_cast<float>(1.0 / static_cast<double>(s_enc))));
  EXPECT_NE(q.decode_scale, bits_of(1.0f));
}

TEST(Nvfp4Rules, SubnormalDecodeScaleIsKept) {
  // Tensor amax 2^-120: 2688 / amax overflows, S_enc = FLT_MAX, and S_dec = 1 / FLT_MAX
  // = 2^-128 (FLT_MAX = (2 - 2^-23) * 2^127; the quotient is 2^-128 (1 + 2^-24 + ...),
  // and the subnormal spacing 2^-149 rounds that to 2^-128), bits 0x00200000.
  // Block scale: fl32(FLT_MAX * fl32(1/6)) = 5.6713724e37; times 2^-120 gives 42.666664,
  // whose E4M3 (spacing 4 in [32, 64)) is 44 = 0x63. Multiplier 1 / fl32(44 * 2^-128)
  // = 7.7336904e36; the element 2^-120 times it is 5.818, code 0x7 (6). Decoded:
  // 6 * 44 * 2^-128 = 33 * 2^-125. With subnormals flushed, S_dec would be 0 and every
  // value would decode to 0.
  const Nvfp4Shape s{16, 16};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[0] = bf16_exact(std::ldexp(1.0f, -120));
  const ref::Quantized q = quantize_on(kHost, s, x);
  EXPECT_EQ(q.decode_scale, 0x00200000u);
  EXPECT_EQ(q.scale[0], 0x63);
  EXPECT_EQ(code_at(q, 0), 0x7);
  const auto back = dequantize_on(kHost, s, q, false);
  EXPECT_EQ(back[0], bits_of(std::ldexp(33.0f, -125)));
  EXPECT_EQ(float_of(back[1]), 0.0f);
}

TEST(Nvfp4Rules, AFiniteMasterThatRoundsToBf16InfIsRefused) {
  // bf16's largest value is 0x7F7F; halfway to the next step (f32 bits 0x7F7F8000, about
  // 3.3961775e38) is a tie that rounds to the even pattern 0x7F80 = Inf: refused. One f32
  // step below (0x7F7F7FFF) rounds down to 0x7F7F: quantized normally.
  const Nvfp4Shape s{16, 32};
  for (const bool refuse : {true, false}) {
    SCOPED_TRACE(refuse ? "rounds to Inf" : "rounds to the bf16 maximum");
    std::vector<float> master(static_cast<std::size_t>(s.numel()), 1.0f);
    master[300] = -float_of(refuse ? 0x7F7F8000u : 0x7F7F7FFFu);
    std::string problems;
    const ref::Quantized q = simulate(kHost, s, master, {0, 257, s.numel()}, &problems);
    EXPECT_EQ(problems, "");
    if (refuse) {
      EXPECT_EQ(q.amax, 0x7FC00000u) << "the NaN flag";
      EXPECT_EQ(q.decode_scale, 0x7FC00000u);
      for (std::uint8_t b : q.scale) EXPECT_EQ(b, 0x7F);
      for (std::uint8_t b : q.data) ASSERT_EQ(b, 0x00);
    } else {
      EXPECT_EQ(q.amax, 0x7F7F0000u);
      EXPECT_EQ(code_at(q, 300), 0xF) << "-amax encodes to -6";
    }
  }
}

}  // namespace
