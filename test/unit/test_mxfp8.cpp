// MXFP8 whole-tensor quantization on the host backend against the independent oracle
// (test_mxfp8_reference.hpp): the scale rule for every bf16 amax (and TransformerEngine's
// RCEIL rule), random data, zeros, subnormals, NaN, Inf, scale boundaries, partial
// blocks, grouped == discrete, the member table, the skip flag (eager and captured),
// dequantize, shapes and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/mxfp8/mxfp8_shard_calls.hpp"
#include "kernels/mxfp8/mxfp8_math.cuh"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_common.hpp"

namespace {
using namespace shardopt;
using namespace mxfp8_test;
namespace ref = mxfp8_ref;

Mxfp8Planes planes_of(ref::Quantized& q) {
  return Mxfp8Planes{q.data_row.data(), q.scale_row.data(), q.data_col.data(), q.scale_col.data()};
}

// Quantizes on the host backend into poisoned buffers.
ref::Quantized quantize_host(const Mxfp8Shape& s, const std::vector<std::uint16_t>& x,
                             const std::int32_t* flag = nullptr) {
  ref::Quantized q = poisoned(s);
  quantize_mxfp8(s, x.data(), planes_of(q), flag, Backend::Host, nullptr);
  return q;
}

void expect_same(const ref::Quantized& got, const ref::Quantized& want, const std::string& what) {
  EXPECT_TRUE(got.data_row == want.data_row) << what << " data_row: " << first_diff(got.data_row, want.data_row);
  EXPECT_TRUE(got.scale_row == want.scale_row) << what << " scale_row: " << first_diff(got.scale_row, want.scale_row);
  EXPECT_TRUE(got.data_col == want.data_col) << what << " data_col: " << first_diff(got.data_col, want.data_col);
  EXPECT_TRUE(got.scale_col == want.scale_col) << what << " scale_col: " << first_diff(got.scale_col, want.scale_col);
}

std::uint16_t bf16_bits(int sign, int biased_exp, int man) {
  return static_cast<std::uint16_t>((sign << 15) | (biased_exp << 7) | man);
}

// ------------------------------------------------------------------ the scale rule

TEST(Mxfp8Scale, ExactRuleEqualsTeRceilAndOracleForEveryBf16Amax) {
  // Every non-negative bf16 pattern: zero, subnormals, normals, Inf, NaNs.
  int te_diffs = 0, oracle_diffs = 0;
  for (std::uint32_t h = 0; h <= 0x7FFF; ++h) {
    const std::uint8_t ours = mxfp8::scale_from_magnitude(h);
    const std::uint8_t te = ref::te_rceil_scale(static_cast<std::uint16_t>(h));
    const std::uint8_t oracle = ref::scale_of(ref::bf16_value(static_cast<std::uint16_t>(h)));
    if (ours != te && te_diffs++ < 10)
      ADD_FAILURE() << "amax bf16 0x" << std::hex << h << ": exact rule 0x" << int(ours) << ", TE RCEIL 0x" << int(te);
    if (ours != oracle && oracle_diffs++ < 10)
      ADD_FAILURE() << "amax bf16 0x" << std::hex << h << ": library 0x" << int(ours) << ", oracle 0x" << int(oracle);
  }
  EXPECT_EQ(te_diffs, 0) << "the exact DESIGN rule and TE's fl32(amax * fl32(1/448)) RCEIL rule differ";
  EXPECT_EQ(oracle_diffs, 0);
  std::printf("scale rule: exact bf16 rule == TE RCEIL model == oracle for all 32768 non-negative bf16 amaxes\n");
}

TEST(Mxfp8Scale, InverseScaleIsTwoToThe127MinusByteForEveryByte) {
  // 2^(127 - byte) in double (exact in f32 for every byte but the NaN scale: 2^127 down
  // to the subnormal 2^-127 of the Inf scale 0xFE); NaN for 0xFF.
  for (int s = 0; s < 0xFF; ++s) {
    const float want = static_cast<float>(std::ldexp(1.0, 127 - s));
    ASSERT_EQ(mxfp8::inverse_scale(static_cast<std::uint8_t>(s)), want) << "scale byte " << s;
  }
  EXPECT_TRUE(std::isnan(mxfp8::inverse_scale(0xFF)));
}

TEST(Mxfp8Scale, ExchangedAmaxBitsOrderNaNAboveInfAboveFinite) {
  EXPECT_EQ(mxfp8::amax_bits(0x7FC1), mxfp8::kAmaxNaN);
  EXPECT_EQ(mxfp8::amax_bits(0x7F80), 0x7F800000u);
  EXPECT_GT(mxfp8::amax_bits(0x7FFF), mxfp8::amax_bits(0x7F80));
  EXPECT_GT(mxfp8::amax_bits(0x7F80), mxfp8::amax_bits(0x7F7F));
  for (std::uint32_t h = 0; h <= 0x7FFF; ++h) {
    ASSERT_EQ(mxfp8::scale_from_amax_bits(mxfp8::amax_bits(h)), mxfp8::scale_from_magnitude(h)) << h;
    if (h > 0) {
      ASSERT_GE(mxfp8::scale_from_magnitude(h), mxfp8::scale_from_magnitude(h - 1)) << "not monotone at " << h;
    }
  }
}

TEST(Mxfp8Scale, EveryBf16AmaxThroughTheApi) {
  // Row k holds the finite bf16 value k once (column k % 32) and zeros elsewhere; two
  // more rows hold Inf and NaN. Rowwise scales then see every amax.
  const std::int64_t rows = 0x7F80 + 2, cols = 32;
  std::vector<std::uint16_t> x(static_cast<std::size_t>(rows * cols), 0);
  for (std::int64_t k = 0; k < rows; ++k) {
    const std::uint16_t v = k < 0x7F80 ? static_cast<std::uint16_t>(k) : (k == 0x7F80 ? 0x7F80 : 0xFFC1);
    x[static_cast<std::size_t>(k * cols + k % 32)] = static_cast<std::uint16_t>(v | ((k & 1) << 15));
  }
  const Mxfp8Shape s{1, rows, cols};
  expect_same(quantize_host(s, x), reference(s, x), "every amax");
}

// ------------------------------------------------------------------ data

TEST(Mxfp8Quantize, RandomDataMatchesReference) {
  const std::vector<Mxfp8Shape> shapes = {{1, 64, 128}, {1, 32, 32}, {1, 40, 72}, {1, 33, 31}, {1, 3, 5},
                                          {1, 1, 1},    {2, 40, 72}, {1, 96, 1000}, {4, 17, 130}, {1, 7, 300},
                                          {3, 64, 256}};
  std::uint32_t seed = 1;
  for (const auto& s : shapes) {
    const auto x = random_bf16(s.numel(), s.cols, seed++);
    expect_same(quantize_host(s, x), reference(s, x),
                "shape " + std::to_string(s.members) + "x" + std::to_string(s.rows) + "x" + std::to_string(s.cols));
  }
}

TEST(Mxfp8Quantize, RandomBitPatternsMatchReference) {
  // Raw finite bf16 patterns: huge dynamic range inside blocks, subnormals, tiny and huge amaxes.
  const Mxfp8Shape s{2, 70, 97};
  const auto x = random_bf16(s.numel(), s.cols, 77, 0, 0, 1.0);
  expect_same(quantize_host(s, x), reference(s, x), "bit patterns");
}

TEST(Mxfp8Quantize, ZerosGiveScaleZeroAndSignedZeros) {
  const Mxfp8Shape s{1, 40, 72};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0) ? 0x8000 : 0x0000;
  const auto q = quantize_host(s, x);
  for (auto b : q.scale_row) ASSERT_EQ(b, 0x00);
  for (auto b : q.scale_col) ASSERT_EQ(b, 0x00);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(q.data_row[i], x[i] ? 0x80 : 0x00) << i;
    ASSERT_EQ(q.data_col[i], x[i] ? 0x80 : 0x00) << i;
  }
  expect_same(q, reference(s, x), "zeros");
}

TEST(Mxfp8Quantize, Bf16SubnormalsScaleZeroAndScaleUpBy2To127) {
  const Mxfp8Shape s{1, 32, 64};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()));
  std::mt19937 rng(5);
  for (auto& v : x) v = static_cast<std::uint16_t>((rng() & 0x8000) | (rng() % 0x80));  // subnormal or zero
  x[0] = 0x0001;  // 2^-133 -> element 2^-6: the smallest normal e4m3 (0x08)
  x[1] = 0x0000;
  // Second rowwise block of row 1: a tiny normal amax 2^-120 (still scale 0x00).
  x[64 + 32] = bf16_bits(0, 7, 0);
  const auto q = quantize_host(s, x);
  for (auto b : q.scale_row) ASSERT_EQ(b, 0x00);
  for (auto b : q.scale_col) ASSERT_EQ(b, 0x00);
  EXPECT_EQ(q.data_row[0], 0x08);
  EXPECT_EQ(q.data_row[64 + 32], 0x70);  // 2^-120 * 2^127 = 128 = 1.0 * 2^7 -> exp field 14, man 0
  expect_same(q, reference(s, x), "subnormals");
}

TEST(Mxfp8Quantize, NaNMakesItsBlocksNaN) {
  const Mxfp8Shape s{1, 64, 96};
  auto x = random_bf16(s.numel(), s.cols, 11);
  const auto clean = quantize_host(s, x);
  const std::int64_t r = 37, c = 45;  // row block (37, 1), column block (1, 45)
  x[static_cast<std::size_t>(r * s.cols + c)] = 0xFFC1;  // a negative NaN with payload
  x[static_cast<std::size_t>(r * s.cols + c + 1)] = 0x7F80;  // an Inf in the same row block: NaN wins
  const auto q = quantize_host(s, x);
  expect_same(q, reference(s, x), "NaN");
  EXPECT_EQ(q.scale_row[static_cast<std::size_t>(r * s.row_blocks() + 1)], 0xFF);
  EXPECT_EQ(q.scale_col[static_cast<std::size_t>(1 * s.cols + c)], 0xFF);
  for (std::int64_t k = 32; k < 64; ++k) EXPECT_EQ(q.data_row[static_cast<std::size_t>(r * s.cols + k)], 0x7F);
  for (std::int64_t k = 32; k < 64; ++k) EXPECT_EQ(q.data_col[static_cast<std::size_t>(k * s.cols + c)], 0x7F);
  // Blocks without the NaN are untouched by it.
  EXPECT_EQ(q.scale_row[0], clean.scale_row[0]);
  EXPECT_EQ(q.data_col[static_cast<std::size_t>(r * s.cols + c + 2)], clean.data_col[static_cast<std::size_t>(r * s.cols + c + 2)]);
}

TEST(Mxfp8Quantize, InfBlocksScale2To127) {
  const Mxfp8Shape s{1, 32, 64};
  auto x = random_bf16(s.numel(), s.cols, 12);
  x[3] = 0x7F80;                    // +Inf in row block (0, 0) and column block (0, 3)
  x[4] = 0xFF80;                    // -Inf
  x[5] = bf16_bits(0, 254, 0x40);   // 1.5 * 2^127 -> 1.5 after the 2^-127 scale
  x[6] = bf16_bits(1, 245, 0);      // -2^118 -> -2^-9, the smallest e4m3 subnormal
  x[7] = bf16_bits(0, 244, 0);      // 2^117 -> 2^-10: a tie between 0 and 2^-9 -> 0
  const auto q = quantize_host(s, x);
  expect_same(q, reference(s, x), "Inf");
  EXPECT_EQ(q.scale_row[0], 0xFE);
  EXPECT_EQ(q.scale_col[3], 0xFE);
  EXPECT_EQ(q.data_row[3], 0x7E);
  EXPECT_EQ(q.data_row[4], 0xFE);
  EXPECT_EQ(q.data_row[5], 0x3C);
  EXPECT_EQ(q.data_row[6], 0x81);
  EXPECT_EQ(q.data_row[7], 0x00);
  EXPECT_EQ(q.data_col[3], 0x7E);
}

TEST(Mxfp8Quantize, ScaleBoundariesAt1p75TimesPowersOfTwo) {
  // For every exponent k of a normal bf16: amax = 1.75 * 2^k exactly, one ulp below and
  // one ulp above, each as the max of a block at a varying position.
  std::vector<std::uint16_t> amaxes;
  for (int biased = 1; biased <= 254; ++biased)
    for (int man : {0x5F, 0x60, 0x61}) amaxes.push_back(bf16_bits(0, biased, man));
  const std::int64_t rows = static_cast<std::int64_t>(amaxes.size()), cols = 40;  // a full and a partial block
  std::mt19937 rng(3);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint16_t a = amaxes[static_cast<std::size_t>(r)];
    for (std::int64_t c = 0; c < cols; ++c) {
      // Smaller values: the same exponent, smaller mantissa, random sign.
      const std::uint16_t m = static_cast<std::uint16_t>((a & 0x7F80) | (rng() % 0x5F));
      x[static_cast<std::size_t>(r * cols + c)] = static_cast<std::uint16_t>(m | ((rng() & 1) << 15));
    }
    x[static_cast<std::size_t>(r * cols + r % 32)] = static_cast<std::uint16_t>(a | ((r & 1) << 15));
    x[static_cast<std::size_t>(r * cols + 32 + r % 8)] = a;
  }
  const Mxfp8Shape s{1, rows, cols};
  const auto q = quantize_host(s, x);
  expect_same(q, reference(s, x), "boundaries");
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint16_t a = amaxes[static_cast<std::size_t>(r)];
    const int biased = a >> 7, man = a & 0x7F;
    const int want = std::max(0, biased - 8 + (man > 0x60 ? 1 : 0));  // e = E - 8 (M <= 1.75) or E - 7
    ASSERT_EQ(q.scale_row[static_cast<std::size_t>(r * 2)], want) << "amax bf16 0x" << std::hex << a;
    ASSERT_EQ(q.scale_row[static_cast<std::size_t>(r * 2 + 1)], want) << "partial block, amax 0x" << std::hex << a;
  }
}

TEST(Mxfp8Quantize, ScalesAndIndicesOfPartialBlocks) {
  const Mxfp8Shape s{2, 33, 70};
  EXPECT_EQ(s.row_blocks(), 3);
  EXPECT_EQ(s.col_blocks(), 2);
  EXPECT_EQ(s.scale_row_numel(), 2 * 33 * 3);
  EXPECT_EQ(s.scale_col_numel(), 2 * 2 * 70);
  EXPECT_EQ(s.element_index(1, 32, 69), 2 * 33 * 70 - 1);
  EXPECT_EQ(s.scale_row_index(1, 32, 69), 2 * 33 * 3 - 1);
  EXPECT_EQ(s.scale_col_index(1, 32, 69), 2 * 2 * 70 - 1);
  EXPECT_EQ(s.scale_col_index(1, 0, 0), 2 * 70);  // member 1 starts a new block row
}

// ------------------------------------------------------------------ grouped weights

TEST(Mxfp8Grouped, OneTensorEqualsDiscreteMembers) {
  const Mxfp8Shape s{3, 40, 72};  // rows % 32 != 0: a naive [G*rows, cols] view would straddle
  const Mxfp8Shape m{1, s.rows, s.cols};
  const auto x = random_bf16(s.numel(), s.cols, 21);
  const auto whole = quantize_host(s, x);
  ref::Quantized cat;
  for (std::int64_t g = 0; g < s.members; ++g) {
    const std::vector<std::uint16_t> xm(x.begin() + g * m.numel(), x.begin() + (g + 1) * m.numel());
    const auto q = quantize_host(m, xm);
    cat.data_row.insert(cat.data_row.end(), q.data_row.begin(), q.data_row.end());
    cat.scale_row.insert(cat.scale_row.end(), q.scale_row.begin(), q.scale_row.end());
    cat.data_col.insert(cat.data_col.end(), q.data_col.begin(), q.data_col.end());
    cat.scale_col.insert(cat.scale_col.end(), q.scale_col.begin(), q.scale_col.end());
  }
  expect_same(whole, cat, "grouped vs discrete");
  expect_same(whole, reference(s, x), "grouped vs reference");
  // Sensitivity: treating the group as one [G*rows, cols] matrix is different.
  const auto naive = quantize_host(Mxfp8Shape{1, s.members * s.rows, s.cols}, x);
  EXPECT_NE(naive.data_col, whole.data_col);
  EXPECT_EQ(naive.data_row, whole.data_row);  // rowwise blocks never cross rows anyway
}

// Members scattered in one buffer (as discretely registered params are placed by the
// layout: reverse order, aligned, gaps), found through a member table.
struct Scattered {
  std::vector<Mxfp8Member> table;
  std::int64_t elements = 0, scale_rows = 0, scale_cols = 0;
};
Scattered scatter(const Mxfp8Shape& s) {
  Scattered out;
  std::int64_t e = 0, sr = 0, sc = 0;
  out.table.resize(static_cast<std::size_t>(s.members));
  for (std::int64_t g = s.members - 1; g >= 0; --g) {  // reverse order, with gaps
    e = (e + 63) / 64 * 64 + 8;
    out.table[static_cast<std::size_t>(g)] = {e, sr + 3, sc + 5};
    e += s.member_numel();
    sr += 3 + s.rows * s.row_blocks();
    sc += 5 + s.col_blocks() * s.cols;
  }
  out.elements = e + 17;
  out.scale_rows = sr + 1;
  out.scale_cols = sc + 1;
  return out;
}

TEST(Mxfp8Grouped, MemberTableQuantizesScatteredMembersInOneCall) {
  const Mxfp8Shape s{4, 40, 72};
  const Mxfp8Shape m{1, s.rows, s.cols};
  const auto x = random_bf16(s.numel(), s.cols, 22);
  const auto whole = quantize_host(s, x);
  const Scattered sc = scatter(s);
  std::vector<std::uint16_t> src(static_cast<std::size_t>(sc.elements), 0x7FC0);  // NaN in the gaps
  for (std::int64_t g = 0; g < s.members; ++g)
    std::copy(x.begin() + g * m.numel(), x.begin() + (g + 1) * m.numel(), src.begin() + sc.table[g].element_offset);
  std::vector<std::uint8_t> drow(src.size(), kPoison), dcol(src.size(), kPoison);
  std::vector<std::uint8_t> srow(static_cast<std::size_t>(sc.scale_rows), kPoison);
  std::vector<std::uint8_t> scol(static_cast<std::size_t>(sc.scale_cols), kPoison);
  quantize_mxfp8(s, src.data(), Mxfp8Planes{drow.data(), srow.data(), dcol.data(), scol.data()}, nullptr,
                 Backend::Host, nullptr, sc.table.data());
  std::vector<bool> used_e(src.size()), used_r(srow.size()), used_c(scol.size());
  for (std::int64_t g = 0; g < s.members; ++g) {
    const Mxfp8Member& t = sc.table[static_cast<std::size_t>(g)];
    for (std::int64_t i = 0; i < m.numel(); ++i) {
      ASSERT_EQ(drow[t.element_offset + i], whole.data_row[g * m.numel() + i]) << g << " " << i;
      ASSERT_EQ(dcol[t.element_offset + i], whole.data_col[g * m.numel() + i]) << g << " " << i;
      used_e[t.element_offset + i] = true;
    }
    for (std::int64_t i = 0; i < m.scale_row_numel(); ++i) {
      ASSERT_EQ(srow[t.scale_row_offset + i], whole.scale_row[g * m.scale_row_numel() + i]);
      used_r[t.scale_row_offset + i] = true;
    }
    for (std::int64_t i = 0; i < m.scale_col_numel(); ++i) {
      ASSERT_EQ(scol[t.scale_col_offset + i], whole.scale_col[g * m.scale_col_numel() + i]);
      used_c[t.scale_col_offset + i] = true;
    }
  }
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (!used_e[i]) {
      ASSERT_TRUE(drow[i] == kPoison && dcol[i] == kPoison) << "gap byte " << i << " written";
    }
  }
  for (std::size_t i = 0; i < srow.size(); ++i) {
    if (!used_r[i]) {
      ASSERT_EQ(srow[i], kPoison);
    }
  }
  for (std::size_t i = 0; i < scol.size(); ++i) {
    if (!used_c[i]) {
      ASSERT_EQ(scol[i], kPoison);
    }
  }
  // The contiguous table gives the plain grouped result.
  const auto table = mxfp8_contiguous_members(s);
  ref::Quantized q = poisoned(s);
  quantize_mxfp8(s, x.data(), planes_of(q), nullptr, Backend::Host, nullptr, table.data());
  expect_same(q, whole, "contiguous table");
}

TEST(Mxfp8Grouped, ShapeOfSpecs) {
  const Mxfp8Shape g = Mxfp8Shape::of(ParamSpec::grouped("moe.w1", 8, {4, 6, 64}));
  EXPECT_EQ(g.members, 8);
  EXPECT_EQ(g.rows, 24);
  EXPECT_EQ(g.cols, 64);
  const Mxfp8Shape p = Mxfp8Shape::of(ParamSpec::tensor("w", {8192, 2048}));
  EXPECT_EQ(p.members, 1);
  EXPECT_EQ(p.rows, 8192);
  EXPECT_EQ(p.cols, 2048);
  const Mxfp8Shape t = Mxfp8Shape::of(Shape{3, 5, 7, 9});
  EXPECT_EQ(t.rows, 105);
  EXPECT_EQ(t.cols, 9);
  try {
    (void)Mxfp8Shape::of(ParamSpec::tensor("layers.0.attn_norm.weight", {2048}));
    FAIL() << "a 1-D tensor was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("attn_norm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)Mxfp8Shape::of(ParamSpec::grouped("moe.bias", 8, {64})), Error);
  EXPECT_THROW((void)Mxfp8Shape::of(Shape{4, 8, 8}, 3), Error);  // dim 0 is not the member count
}

// ------------------------------------------------------------------ skip flag (seed 000)

TEST(Mxfp8Skip, FlagSetWritesNothingSingleGroupedAndDiscrete) {
  const Mxfp8Shape s{3, 40, 72};
  const Mxfp8Shape m{1, s.rows, s.cols};
  const auto x = random_bf16(s.numel(), s.cols, 31);
  const auto want = reference(s, x);
  const auto table = mxfp8_contiguous_members(s);
  for (std::int32_t flag : {1, 0, 7}) {
    const bool skip = flag != 0;
    ref::Quantized single = poisoned(s), grouped = poisoned(s), discrete = poisoned(s);
    quantize_mxfp8(s, x.data(), planes_of(single), &flag, Backend::Host, nullptr);
    quantize_mxfp8(s, x.data(), planes_of(grouped), &flag, Backend::Host, nullptr, table.data());
    for (std::int64_t g = 0; g < s.members; ++g)
      quantize_mxfp8(m, x.data() + g * m.numel(),
                     Mxfp8Planes{discrete.data_row.data() + g * m.numel(), discrete.scale_row.data() + g * m.scale_row_numel(),
                                 discrete.data_col.data() + g * m.numel(), discrete.scale_col.data() + g * m.scale_col_numel()},
                     &flag, Backend::Host, nullptr);
    for (const auto* q : {&single, &grouped, &discrete}) expect_same(*q, skip ? poisoned(s) : want, "flag " + std::to_string(flag));
  }
}

TEST(Mxfp8Skip, CapturedQuantizeReadsTheFlagAtReplayNotAtCapture) {
  const Mxfp8Shape s{2, 40, 72};
  auto x = random_bf16(s.numel(), s.cols, 32);
  const auto table = mxfp8_contiguous_members(s);
  std::int32_t flag = 1;  // set at capture time: must not be frozen into the graph
  ref::Quantized single = poisoned(s), grouped = poisoned(s);
  HostStream stream;
  stream.begin_capture();
  quantize_mxfp8(s, x.data(), planes_of(single), &flag, Backend::Host, stream.handle());
  quantize_mxfp8(s, x.data(), planes_of(grouped), &flag, Backend::Host, stream.handle(), table.data());
  const HostGraph graph = stream.end_capture();
  expect_same(single, poisoned(s), "nothing runs at capture");

  flag = 0;  // first microbatch: quantize
  graph.replay();
  const auto first = reference(s, x);
  expect_same(single, first, "replay, flag clear");
  expect_same(grouped, first, "grouped replay, flag clear");

  const auto y = random_bf16(s.numel(), s.cols, 33);  // the weights change in place...
  std::copy(y.begin(), y.end(), x.begin());
  flag = 1;  // ...but later microbatches skip
  graph.replay();
  expect_same(single, first, "replay, flag set");
  expect_same(grouped, first, "grouped replay, flag set");

  flag = 0;  // next step's first microbatch
  graph.replay();
  expect_same(single, reference(s, x), "replay, flag clear again");
  expect_same(grouped, reference(s, x), "grouped replay, flag clear again");
}

// ------------------------------------------------------------------ dequantize

TEST(Mxfp8Dequantize, BothPlanesMatchReference) {
  const Mxfp8Shape s{2, 40, 72};
  auto x = random_bf16(s.numel(), s.cols, 41, -140, 120, 0.05);
  x[5] = 0x7FC0;   // a NaN block
  x[77] = 0x7F80;  // an Inf block
  for (int i = 200; i < 264; ++i) x[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(i % 7);  // subnormal/zero blocks
  const auto q = quantize_host(s, x);
  std::vector<float> row(static_cast<std::size_t>(s.numel())), col(row.size());
  dequantize_mxfp8(s, Mxfp8Plane::Rowwise, q.data_row.data(), q.scale_row.data(), row.data(), Backend::Host, nullptr);
  dequantize_mxfp8(s, Mxfp8Plane::Columnwise, q.data_col.data(), q.scale_col.data(), col.data(), Backend::Host, nullptr);
  for (std::int64_t g = 0; g < s.members; ++g)
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t c = 0; c < s.cols; ++c) {
        const auto e = static_cast<std::size_t>(s.element_index(g, r, c));
        const float wr = ref::dequantize(q.data_row[e], q.scale_row[static_cast<std::size_t>(s.scale_row_index(g, r, c))]);
        const float wc = ref::dequantize(q.data_col[e], q.scale_col[static_cast<std::size_t>(s.scale_col_index(g, r, c))]);
        ASSERT_TRUE(bits_of(row[e]) == bits_of(wr) || (std::isnan(row[e]) && std::isnan(wr))) << e;
        ASSERT_TRUE(bits_of(col[e]) == bits_of(wc) || (std::isnan(col[e]) && std::isnan(wc))) << e;
      }
  // The round trip is close for ordinary values: relative error <= 2^-4 (3 mantissa bits).
  const auto y = random_bf16(s.numel(), s.cols, 42, -4, 4, 0.0);
  const auto qy = quantize_host(s, y);
  dequantize_mxfp8(s, Mxfp8Plane::Rowwise, qy.data_row.data(), qy.scale_row.data(), row.data(), Backend::Host, nullptr);
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double v = ref::bf16_value(y[i]);
    if (std::fabs(v) > 1e-2) {
      ASSERT_LE(std::fabs(row[i] - v), std::fabs(v) / 16 + 1e-30) << i;
    }
  }
}

// ------------------------------------------------------------------ errors

TEST(Mxfp8Errors, BadArgumentsSayWhatToChange) {
  std::vector<std::uint16_t> x(64);
  ref::Quantized q = poisoned(Mxfp8Shape{1, 8, 8});
  EXPECT_THROW(quantize_mxfp8(Mxfp8Shape{1, 0, 8}, x.data(), planes_of(q), nullptr, Backend::Host, nullptr), Error);
  EXPECT_THROW(quantize_mxfp8(Mxfp8Shape{1, 8, 8}, nullptr, planes_of(q), nullptr, Backend::Host, nullptr), Error);
  Mxfp8Planes missing = planes_of(q);
  missing.scale_col = nullptr;
  EXPECT_THROW(quantize_mxfp8(Mxfp8Shape{1, 8, 8}, x.data(), missing, nullptr, Backend::Host, nullptr), Error);
  std::vector<float> master(64);
  try {
    mxfp8_partial_scales(Mxfp8Shape{1, 8, 8}, Range{10, 65}, master.data(), q.scale_row.data(), q.scale_col.data(),
                         Backend::Host, nullptr);
    FAIL() << "a range past the tensor was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfRange);
    EXPECT_NE(std::string(e.what()).find("param_offset"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mxfp8_partial_scales(Mxfp8Shape{1, 8, 8}, Range{5, 4}, master.data(), q.scale_row.data(),
                                    q.scale_col.data(), Backend::Host, nullptr),
               Error);
}

}  // namespace
