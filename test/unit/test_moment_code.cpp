// The 8-bit codes of block-quantized Adam moments (kernels/adam/moment_code.cuh) against
// the maps as docs/state_precision.md defines them, computed here in double: every entry,
// the nearest-entry rule, and the round trips that make a checkpoint resume exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/moment_maps_doc.hpp"
#include "kernels/adam/moment_code.cuh"

namespace {
using namespace shardopt;
using kernels::kMomentMaps;
using test::doc_map;

TEST(MomentCode, MapsAreTheDocumentedOnes) {
  for (bool second : {false, true}) {
    const std::vector<double> want = doc_map(second);
    const float* got = second ? kMomentMaps.second : kMomentMaps.first;
    ASSERT_EQ(want.size(), second ? 256u : 128u);
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i], static_cast<float>(want[i])) << (second ? "second" : "first") << " entry " << i;
      if (i > 0) {
        EXPECT_LT(got[i - 1], got[i]);
      }
    }
  }
  // A worked example (docs): the first map's decade 1e-1..1 has 64 codes; 0.5 lies
  // between 0.1 + 0.9 x 27.5/64 = 0.48672 and 0.1 + 0.9 x 28.5/64 = 0.50078.
  EXPECT_FLOAT_EQ(kMomentMaps.first[1 + 2 + 4 + 8 + 16 + 32 + 28], 0.50078125f);
  EXPECT_EQ(kernels::encode_first_moment(kMomentMaps, -0.25f, 0.5f), 0x80 | (1 + 2 + 4 + 8 + 16 + 32 + 28));
}

// A byte decodes to its documented value: the sign bit's sign times the first map's entry
// of its low 7 bits times the scale, every byte under scales of every kind (the decoder
// reads a signed table instead of negating: the same bits).
TEST(MomentCode, DecodeIsTheDocumentedValue) {
  for (float scale : {1.0f, 0.5f, 3.7f, 0x1p-70f, 0x1p70f, 1e-30f, 0.0f, std::numeric_limits<float>::infinity()})
    for (int c = 0; c < 256; ++c) {
      const float magnitude = kMomentMaps.first[c & 0x7F] * scale;
      const float want = (c & 0x80) != 0 ? -magnitude : magnitude;
      const float got = kernels::decode_first_moment(kMomentMaps, static_cast<std::uint8_t>(c), scale);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "byte " << c << " scale " << scale;
      } else {
        EXPECT_EQ(num::f32_bits(got), num::f32_bits(want)) << "byte " << c << " scale " << scale;
      }
    }
}

TEST(MomentCode, NearestEntryAsDocumented) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-8.0, 0.0);
  for (bool second : {false, true}) {
    const std::vector<double> map = doc_map(second);
    const float* table = second ? kMomentMaps.second : kMomentMaps.first;
    int checked = 0;
    for (int t = 0; t < 200000; ++t) {
      const float a = static_cast<float>(std::pow(10.0, exponent(rng)));
      std::size_t best = 0;
      for (std::size_t i = 1; i < map.size(); ++i)
        if (std::fabs(map[i] - a) < std::fabs(map[best] - a)) best = i;
      // Skip near-ties, where the float distances of the rule and the double ones here
      // may order differently (the rule itself is what the kernels and twins share).
      const double d1 = std::fabs(map[best] - a);
      const double d2 = std::min(best > 0 ? std::fabs(map[best - 1] - a) : 1e300,
                                 best + 1 < map.size() ? std::fabs(map[best + 1] - a) : 1e300);
      if (d2 - d1 <= 1e-6 * a) continue;
      ASSERT_EQ(kernels::nearest_code(table, static_cast<int>(map.size()), a), static_cast<int>(best)) << a;
      ++checked;
    }
    EXPECT_GT(checked, 190000);
  }
  EXPECT_EQ(kernels::nearest_code(kMomentMaps.first, 128, 0.0f), 0);
  EXPECT_EQ(kernels::nearest_code(kMomentMaps.first, 128, 1.0f), 127);
  EXPECT_EQ(kernels::nearest_code(kMomentMaps.first, 128, std::nanf("")), 0);
}

// The kernels find a code through a table keyed by the float's top bits (one read and one
// comparison); it must give nearest_code's index for every float. The rule is monotone in
// a (checked on a sweep of 16.6 million floats, bits stepping by 64), so four floats per
// key prove a key's whole span: its first and last float, and the two sides of the one
// boundary its entry places (or none). Below the first key every float takes code 0.
TEST(MomentCode, CodeTablesEqualTheRule) {
  using shardopt::num::f32_from_bits;
  ASSERT_TRUE(kMomentMaps.one_boundary_per_key);
  for (bool second : {false, true}) {
    const float* map = second ? kMomentMaps.second : kMomentMaps.first;
    const std::uint32_t* table = second ? kMomentMaps.second_codes : kMomentMaps.first_codes;
    const int n = second ? 256 : 128;
    int last_code = 0;
    for (std::uint32_t bits = 0; bits <= 0x3F800000u; bits += 64) {
      const float a = f32_from_bits(bits);
      const int want = kernels::nearest_code(map, n, a);
      ASSERT_GE(want, last_code) << "the rule is not monotone at " << a;
      last_code = want;
      ASSERT_EQ(kernels::nearest_code_keyed(table, a), want) << a;
      ASSERT_EQ(kernels::nearest_code_unit(table, a), want) << a;
    }
    const float below = f32_from_bits((kernels::kKeyLow << kernels::kKeyShift) - 1);
    ASSERT_EQ(kernels::nearest_code(map, n, below), 0);
    ASSERT_EQ(kernels::nearest_code_keyed(table, below), 0);
    int boundaries = 0;
    for (int k = 0; k < kernels::kKeys; ++k) {
      const std::uint32_t first = (kernels::kKeyLow + static_cast<std::uint32_t>(k)) << kernels::kKeyShift;
      const std::uint32_t last = first | kernels::kKeyLowBits;
      const std::uint32_t t = kernels::code_table_boundary(table[k]);
      std::vector<std::uint32_t> probes = {first, last};
      if (t != kernels::kKeyLowBits) {
        probes.push_back(first | t);
        probes.push_back(first | (t + 1));
        ++boundaries;
        // The entry's boundary is one: the rule changes code exactly there.
        ASSERT_EQ(kernels::nearest_code(map, n, f32_from_bits(first | (t + 1))),
                  kernels::nearest_code(map, n, f32_from_bits(first | t)) + 1)
            << "key " << k;
      } else {
        ASSERT_EQ(kernels::nearest_code(map, n, f32_from_bits(first)), kernels::nearest_code(map, n, f32_from_bits(last)))
            << "key " << k << " has a boundary its entry misses";
      }
      for (std::uint32_t b : probes) {
        ASSERT_EQ(kernels::nearest_code_keyed(table, f32_from_bits(b)), kernels::nearest_code(map, n, f32_from_bits(b)))
            << "key " << k << " float " << f32_from_bits(b);
        ASSERT_EQ(kernels::nearest_code_unit(table, f32_from_bits(b)), kernels::nearest_code(map, n, f32_from_bits(b)))
            << "key " << k << " float " << f32_from_bits(b);
      }
    }
    // Nearly every boundary between two entries lies inside a key's span (one may fall on
    // a span's last float, where the next key's entry starts with the next code).
    EXPECT_GE(boundaries, n - 3) << (second ? "second" : "first");
    for (int i = 0; i + 1 < n; ++i) {
      const float mid = map[i] + (map[i + 1] - map[i]) / 2;  // the ties
      for (float a : {map[i], std::nextafter(map[i], 0.0f), std::nextafter(map[i], 2.0f), mid,
                      std::nextafter(mid, 0.0f), std::nextafter(mid, 2.0f)})
        ASSERT_EQ(kernels::nearest_code_keyed(table, a), kernels::nearest_code(map, n, a)) << a;
    }
    constexpr float kInf = std::numeric_limits<float>::infinity();
    // 1 and every float above it read 1's own entry (the last code); negative floats and
    // NaN read it too and take 0.
    for (float a : {0.0f, -0.0f, 1.0f, std::nextafter(1.0f, 2.0f), 1.5f, 2.0f, 3e38f, kInf, -1e-3f, -1.0f,
                    -kInf, std::nanf(""), -std::nanf(""), 1e-30f, 0x1p-149f})
      EXPECT_EQ(kernels::nearest_code_keyed(table, a), kernels::nearest_code(map, n, a)) << a;
    // The encoders' reader under a fast scale: quotients in [0, 1], and NaN, which codes as 0.
    for (float a : {0.0f, 0x1p-149f, 1e-30f, 0.5f, std::nextafter(1.0f, 0.0f), 1.0f, std::nanf("")})
      EXPECT_EQ(kernels::nearest_code_unit(table, a), kernels::nearest_code(map, n, a)) << a;
  }
}

// The encoders divide by the block's scale through its rounded reciprocal and a correction
// (divide_by_scale); the quotient must be the IEEE division's for every 0 <= a <= scale
// that can code to anything but 0 (quotients >= 2^-24). Scales across the fast range and
// outside it (where the division itself runs), significands 1.0 and all ones among them,
// a of every exponent from the scale's down 26 binades, any significand, up to the scale.
TEST(MomentCode, DivisionByScaleIsTheDivision) {
  using shardopt::num::f32_bits;
  using shardopt::num::f32_from_bits;
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<std::uint32_t> exponent(127 - 80, 127 + 80);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7FFFFF);
  std::int64_t checked = 0, fast = 0;
  for (int t = 0; t < 40000; ++t) {
    const std::uint32_t man = t % 3 == 0 ? 0u : (t % 3 == 1 ? 0x7FFFFFu : mantissa(rng));
    const float scale = f32_from_bits((exponent(rng) << 23) | man);
    const kernels::CodeScale cs = kernels::code_scale(scale);
    fast += cs.fast ? 1 : 0;
    std::uniform_int_distribution<std::uint32_t> drop(0, 26);  // quotient exponents 0 .. -26
    for (int k = 0; k < 100; ++k) {
      float a = f32_from_bits(((f32_bits(scale) >> 23) - drop(rng)) << 23 | mantissa(rng));
      if (k == 0 || a > scale) a = scale;
      if (k == 1) a = std::nextafter(scale, 0.0f);
      const float want = a / scale;
      const float got = kernels::divide_by_scale(a, cs);
      if (want >= 0x1p-24f) {
        ASSERT_EQ(f32_bits(got), f32_bits(want)) << a << " / " << scale;
        ++checked;
      } else {
        ASSERT_LT(got, 0x1p-23f) << a << " / " << scale;  // codes as 0, like the division
      }
    }
  }
  EXPECT_GT(checked, 3000000);
  EXPECT_GT(fast, 30000);
  EXPECT_LT(fast, 40000);  // some scales outside [2^-64, 2^64] take the division
  EXPECT_FALSE(kernels::code_scale(0x1p-65f).fast);
  EXPECT_FALSE(kernels::code_scale(0x1p65f).fast);
  EXPECT_FALSE(kernels::code_scale(std::numeric_limits<float>::infinity()).fast);
  EXPECT_FALSE(kernels::code_scale(std::nanf("")).fast);
  EXPECT_TRUE(kernels::code_scale(0x1p-64f).fast);
  EXPECT_TRUE(kernels::code_scale(0x1p64f).fast);
}

// Decoding a block and encoding it again gives its bytes and scale back: what makes a
// checkpoint (saved decoded, F32) resume bitwise. Zero scale: every byte decodes to 0.
TEST(MomentCode, DecodeThenEncodeIsExact) {
  for (float scale : {1.0f, 3.7e-3f, 2.5e-9f, 611.0f}) {
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<std::uint8_t>(c);
      if ((c & 0x7F) != 0 || c == 0) {  // 0x80 (a negative zero) is never written
        const float m = kernels::decode_first_moment(kMomentMaps, code, scale);
        EXPECT_EQ(kernels::encode_first_moment(kMomentMaps, m, scale), code) << c << " at " << scale;
      }
      const float v = kernels::decode_second_moment(kMomentMaps, code, scale);
      EXPECT_EQ(kernels::encode_second_moment(kMomentMaps, std::sqrt(v), scale), code) << c << " at " << scale;
    }
    EXPECT_EQ(kernels::decode_first_moment(kMomentMaps, 0x7F, scale), scale);
    EXPECT_EQ(kernels::decode_first_moment(kMomentMaps, 0xFF, scale), -scale);
  }
  EXPECT_EQ(kernels::encode_first_moment(kMomentMaps, 1.0f, 0.0f), 0);
  EXPECT_EQ(kernels::decode_second_moment(kMomentMaps, 200, 0.0f), 0.0f);
}

}  // namespace
