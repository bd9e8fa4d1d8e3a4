// The 8-bit codes of block-quantized Adam moments (kernels/adam/moment_code.cuh) against
// the maps as docs/state_precision.md defines them, computed here in double: every entry,
// the nearest-entry rule, and the round trips that make a checkpoint resume exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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

// The kernels start the nearest-entry search at a table entry keyed by the float's top
// bits and walk from there; it must give nearest_code's index for every input: every float
// in [0, 1] whose bits step by 64 (16.6 million values), both maps, the entries, the
// midpoints between them (the ties), their neighbours, and the first float of every key.
TEST(MomentCode, IndexedSearchEqualsTheSearch) {
  for (bool second : {false, true}) {
    const float* map = second ? kMomentMaps.second : kMomentMaps.first;
    const std::uint8_t* start = second ? kMomentMaps.second_start : kMomentMaps.first_start;
    const int n = second ? 256 : 128;
    for (std::uint32_t bits = 0; bits <= 0x3F800000u; bits += 64) {
      const float a = shardopt::num::f32_from_bits(bits);
      ASSERT_EQ(kernels::nearest_code_indexed(map, start, n, a), kernels::nearest_code(map, n, a)) << a;
    }
    for (int i = 0; i + 1 < n; ++i) {
      const float mid = map[i] + (map[i + 1] - map[i]) / 2;  // the ties
      for (float a : {map[i], std::nextafter(map[i], 0.0f), std::nextafter(map[i], 2.0f), mid,
                      std::nextafter(mid, 0.0f), std::nextafter(mid, 2.0f)})
        ASSERT_EQ(kernels::nearest_code_indexed(map, start, n, a), kernels::nearest_code(map, n, a)) << a;
    }
    for (std::uint32_t key = kernels::kStartKeyLow; key < kernels::kStartKeyLow + kernels::kStartKeys; ++key) {
      const float a = shardopt::num::f32_from_bits(key << kernels::kStartShift);
      ASSERT_EQ(kernels::nearest_code_indexed(map, start, n, a), kernels::nearest_code(map, n, a)) << a;
      // The table's promise: its entry is the largest <= the key's smallest float, and the
      // key's span [a, next key's a) holds at most one more entry (the one step).
      const int entry = start[key - kernels::kStartKeyLow];
      const float next = shardopt::num::f32_from_bits((key + 1) << kernels::kStartShift);
      ASSERT_LE(map[entry], a) << a;
      ASSERT_GT(map[entry + 1], a) << a;
      ASSERT_TRUE(entry + 2 >= n || map[entry + 2] >= next) << "two entries in the span of key " << key;
    }
  }
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
