// NVFP4 whole-tensor quantization on the host backend: hand-computed anchors (E2M1 ties
// after scaling, a block scale on an E4M3 tie, a tiny block against a large tensor amax,
// zeros), then the independent oracle (test_nvfp4_reference.hpp) on every bf16 block
// amax, random data from 1e-30 to 1e30, subnormals, partial blocks; the NaN / Inf
// refusal; dequantize; the batch; captured == eager; shapes and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "kernels/nvfp4/nvfp4_math.cuh"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace {
using namespace shardopt;
using namespace nvfp4_test;
namespace ref = nvfp4_ref;

constexpr Backend kHost = Backend::Host;

std::uint16_t bf16(float v) { return mxfp8_ref::to_bf16(v); }

// Nibble i of a data plane.
int code_at(const ref::Quantized& q, std::int64_t i) {
  return (q.data[static_cast<std::size_t>(i / 2)] >> (4 * (i % 2))) & 0xF;
}

void expect_same(const ref::Quantized& got, const ref::Quantized& want, const std::string& what) {
  EXPECT_TRUE(got.data == want.data) << what << " data: " << first_diff(got.data, want.data);
  EXPECT_TRUE(got.scale == want.scale) << what << " scale: " << first_diff(got.scale, want.scale);
  EXPECT_EQ(got.amax, want.amax) << what << " amax bits";
  EXPECT_EQ(got.decode_scale, want.decode_scale) << what << " decode_scale bits";
}

// ------------------------------------------------------------------ hand-computed anchors

// A [16, 32] tensor: block 0 (columns 0-15) holds 2688, so S_enc = 2688 / 2688 = 1 and
// S_dec = 1; block 1 (columns 16-31) holds the values of row 0 below, amax 6, so its
// scale is e4m3(6 * fl32(1/6)) = e4m3(1.0) and its multiplier exactly 1.
// f32_to_e2m1 (a magic-number addition per binade, nvfp4_math.cuh) equals the library's
// generic binary-format rounding (round_magnitude<2, 1> plus saturation, the rule's
// definition) on every f32 within 2^13 bit patterns of each place where the code or the
// method changes (the midpoints, 1, 2, 4, 6, Inf, zero; both signs), on NaNs, and on every 61st f32 pattern. (All
// 2^32 inputs were checked once, 2026-11-25, and again for the binade form, 2026-11-26.)
std::uint8_t generic_e2m1(float f) {
  const std::uint32_t u = num::f32_bits(f);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0;
  std::uint32_t code = a == 0x7F800000u ? 7u : num::detail::round_magnitude<2, 1>(a);
  if (code > 7u) code = 7u;
  return static_cast<std::uint8_t>(((u >> 28) & 0x8u) | code);
}

TEST(Nvfp4, E2m1EqualsGenericRounding) {
  std::int64_t checked = 0;
  auto check = [&](std::uint32_t bits) {
    const float f = num::f32_from_bits(bits);
    ++checked;
    if (nvfp4::f32_to_e2m1(f) != generic_e2m1(f)) {
      ADD_FAILURE() << "f32 bits 0x" << std::hex << bits << ": " << int{nvfp4::f32_to_e2m1(f)} << " != "
                    << int{generic_e2m1(f)};
      return false;
    }
    return true;
  };
  // The ties and 6, the binade edges 1, 2 and 4 (where the conversion changes its magic
  // number), 0, Inf and NaN.
  for (std::uint32_t anchor : {0x00000000u, 0x3E800000u, 0x3F400000u, 0x3F800000u, 0x3FA00000u, 0x3FE00000u,
                               0x40000000u, 0x40200000u, 0x40600000u, 0x40800000u, 0x40A00000u, 0x40C00000u,
                               0x7F800000u, 0x7FC00000u})
    for (std::uint32_t sign : {0u, 0x80000000u})
      for (std::int64_t d = -8192; d <= 8192; ++d) {
        const std::int64_t bits = static_cast<std::int64_t>(anchor) + d;
        if (bits < 0 || bits > 0x7FFFFFFF) continue;
        if (!check(static_cast<std::uint32_t>(bits) | sign)) return;
      }
  for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 61)
    if (!check(static_cast<std::uint32_t>(bits))) return;
  EXPECT_GT(checked, 70000000);
}

TEST(Nvfp4, E2m1TiesAfterScalingRoundToEven) {
  const Nvfp4Shape s{16, 32};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[0] = bf16(2688.0f);
  const float values[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f,
                          -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, 0.5f};
  // Ties go to the even mantissa: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
  // 3.5 -> 4, 5 -> 4; -0.25 keeps its sign (0x8).
  const int want[] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0x8, 0xA, 0xA, 0xC, 0xC, 0xE, 0xE, 0x1};
  for (int j = 0; j < 16; ++j) x[static_cast<std::size_t>(16 + j)] = bf16(values[j]);
  const ref::Quantized q = quantize_on(kHost, s, x);
  EXPECT_EQ(q.amax, ref::bits(2688.0f));
  EXPECT_EQ(q.decode_scale, ref::bits(1.0f));
  EXPECT_EQ(q.scale[0], 0x7E);  // e4m3(fl32(2688 * fl32(1/6))) = 448
  EXPECT_EQ(q.scale[1], 0x38);  // 1.0
  for (int j = 0; j < 16; ++j) EXPECT_EQ(code_at(q, 16 + j), want[j]) << "value " << values[j];
  expect_same(q, reference(s, x), "ties");
  // The grid values come back exactly.
  const auto back = dequantize_on(kHost, s, q, false);
  for (int j = 0; j < 16; ++j)
    EXPECT_EQ(ref::from_bits(back[static_cast<std::size_t>(16 + j)]), ref::e2m1_value(static_cast<std::uint8_t>(want[j])));
}

TEST(Nvfp4, TiesInABlockOfScaleTwo) {
  // Block amax 12: scale e4m3(fl32(12 * fl32(1/6))) = 2 (0x40), multiplier 0.5.
  const Nvfp4Shape s{16, 32};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[0] = bf16(2688.0f);
  const float values[] = {12.0f, 1.5f, 5.0f, 7.0f, -0.5f, 3.0f};
  const int want[] = {0x7, 0x2, 0x4, 0x6, 0x8, 0x3};  // 6, 0.75 -> 1, 2.5 -> 2, 3.5 -> 4, -0.25 -> -0, 1.5
  for (int j = 0; j < 6; ++j) x[static_cast<std::size_t>(16 + j)] = bf16(values[j]);
  const ref::Quantized q = quantize_on(kHost, s, x);
  EXPECT_EQ(q.scale[1], 0x40);
  for (int j = 0; j < 6; ++j) EXPECT_EQ(code_at(q, 16 + j), want[j]) << "value " << values[j];
}

TEST(Nvfp4, BlockScaleOnAnE4m3TieRoundsToEven) {
  // S_enc = 1. Block amax 6.375: fl32(6.375 * fl32(1/6)) = 1.0625 exactly, halfway
  // between e4m3 1.0 (0x38) and 1.125 (0x39): nearest even is 0x38. Block amax 7.125:
  // 1.1875, halfway between 1.125 (0x39) and 1.25 (0x3A): 0x3A.
  const Nvfp4Shape s{16, 48};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[0] = bf16(2688.0f);
  x[16] = bf16(6.375f);
  x[32] = bf16(7.125f);
  const ref::Quantized q = quantize_on(kHost, s, x);
  EXPECT_EQ(q.scale[1], 0x38);
  EXPECT_EQ(q.scale[2], 0x3A);
  expect_same(q, reference(s, x), "e4m3 ties");
}

TEST(Nvfp4, TinyBlockAgainstALargeAmaxSaturates) {
  // Block 1's amax 2^-20 makes fl32(2^-20 / 6) < 2^-10, so its scale rounds to 0; the
  // multiplier is then min(1 / 0, FLT_MAX) = FLT_MAX and every nonzero element
  // saturates to +-6 (zeros stay zero). Dequantized, the block is all zeros.
  const Nvfp4Shape s{16, 32};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[0] = bf16(2688.0f);
  x[16] = bf16(std::ldexp(1.0f, -20));
  x[17] = bf16(-std::ldexp(1.0f, -30));
  const ref::Quantized q = quantize_on(kHost, s, x);
  EXPECT_EQ(q.scale[1], 0x00);
  EXPECT_EQ(code_at(q, 16), 0x7);
  EXPECT_EQ(code_at(q, 17), 0xF);
  EXPECT_EQ(code_at(q, 18), 0x0);
  expect_same(q, reference(s, x), "tiny block");
  const auto back = dequantize_on(kHost, s, q, false);
  EXPECT_EQ(ref::from_bits(back[16]), 0.0f);
}

TEST(Nvfp4, ZeroTensorAndZeroBlocks) {
  // amax 0: S_enc = 1, S_dec = 1, every scale 0, every code 0 (0x8 for -0).
  const Nvfp4Shape s{17, 33};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[1] = 0x8000;  // -0
  ref::Quantized q = quantize_on(kHost, s, x);
  EXPECT_EQ(q.amax, 0u);
  EXPECT_EQ(q.decode_scale, ref::bits(1.0f));
  EXPECT_EQ(q.data[0], 0x80);
  for (std::size_t k = 1; k < q.data.size(); ++k) EXPECT_EQ(q.data[k], 0) << k;
  for (std::uint8_t b : q.scale) EXPECT_EQ(b, 0);
  expect_same(q, reference(s, x), "zero tensor");
  // A nonzero tensor with all-zero blocks: those blocks' scales are 0.
  x[static_cast<std::size_t>(16 * 33 + 32)] = bf16(3.0f);  // only block (1, 2) is nonzero
  q = quantize_on(kHost, s, x);
  for (std::size_t b = 0; b < q.scale.size(); ++b) EXPECT_EQ(q.scale[b] != 0, b == 5) << b;
  expect_same(q, reference(s, x), "zero blocks");
}

// ------------------------------------------------------------------ against the oracle

TEST(Nvfp4, EveryBf16BlockAmaxMatchesReference) {
  // S_enc = 1 (one block holds 2688); every other block holds one positive bf16 value
  // from 2^-30 to 2688 as its amax (so every E4M3 rounding boundary of the block scale
  // is met) and random smaller values.
  std::vector<std::uint16_t> amaxes;
  for (std::uint16_t h = bf16(std::ldexp(1.0f, -30)); h <= bf16(2688.0f); ++h) amaxes.push_back(h);
  const Nvfp4Shape s{16, 16 * static_cast<std::int64_t>(amaxes.size() + 1)};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  x[0] = bf16(2688.0f);
  for (std::size_t b = 0; b < amaxes.size(); ++b) {
    const float a = static_cast<float>(mxfp8_ref::bf16_value(amaxes[b]));
    const std::int64_t c0 = 16 * static_cast<std::int64_t>(b + 1);
    for (std::int64_t r = 0; r < 16; ++r)
      for (std::int64_t c = c0; c < c0 + 16; ++c) x[static_cast<std::size_t>(r * s.cols + c)] = bf16(a * u(rng));
    x[static_cast<std::size_t>((b % 16) * s.cols + c0 + b % 13)] = amaxes[b];
  }
  expect_same(quantize_on(kHost, s, x), reference(s, x), "every block amax");
}

TEST(Nvfp4, RandomDataAtManyMagnitudesMatchesReference) {
  const std::vector<Nvfp4Shape> shapes = {{16, 16}, {32, 64}, {17, 33}, {1, 1}, {3, 5},  {48, 200},
                                          {100, 37}, {1, 31}, {31, 1}, {64, 48}, {15, 17}, {130, 129}};
  std::uint32_t seed = 1;
  for (const auto& s : shapes) {
    const std::string name = std::to_string(s.rows) + "x" + std::to_string(s.cols);
    // Per row 2^k with k in [-100, 100]: magnitudes 1e-30 .. 1e30 in one tensor.
    auto x = mxfp8_test::random_bf16(s.numel(), s.cols, seed++, -100, 100);
    expect_same(quantize_on(kHost, s, x), reference(s, x), name + " wide");
    x = mxfp8_test::random_bf16(s.numel(), s.cols, seed++, -3, 3);
    expect_same(quantize_on(kHost, s, x), reference(s, x), name + " narrow");
    x = mxfp8_test::random_bf16(s.numel(), s.cols, seed++, 0, 0, 1.0);  // raw finite bit patterns
    expect_same(quantize_on(kHost, s, x), reference(s, x), name + " raw");
  }
}

TEST(Nvfp4, SubnormalInputsMatchReference) {
  const Nvfp4Shape s{40, 40};
  std::mt19937 rng(3);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()));
  for (auto& h : x) h = static_cast<std::uint16_t>(rng() & 0x807F);  // bf16 subnormals and zeros
  // amax is a bf16 subnormal: 2688 / amax overflows to Inf and S_enc clamps to FLT_MAX.
  expect_same(quantize_on(kHost, s, x), reference(s, x), "subnormals only");
  for (std::size_t i = 0; i < x.size(); i += 7) x[i] = bf16(std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20));
  expect_same(quantize_on(kHost, s, x), reference(s, x), "subnormals among normals");
}

// ------------------------------------------------------------------ NaN / Inf

TEST(Nvfp4, NonFiniteInputIsRefused) {
  const Nvfp4Shape s{20, 36};
  for (std::uint16_t special : {std::uint16_t{0x7FC0}, std::uint16_t{0xFFFF}, std::uint16_t{0x7F80},
                                std::uint16_t{0xFF80}}) {
    auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 9, -3, 3);
    x[123] = special;
    const ref::Quantized q = quantize_on(kHost, s, x);
    EXPECT_TRUE(std::isnan(ref::from_bits(q.amax))) << std::hex << special;
    EXPECT_TRUE(std::isnan(ref::from_bits(q.decode_scale)));
    for (std::uint8_t b : q.scale) EXPECT_EQ(b, 0x7F);
    for (std::uint8_t b : q.data) EXPECT_EQ(b, 0);
    expect_same(q, reference(s, x), "refused");
    // One quiet NaN, bit for bit (the GPU kernels give the same): f32 0x7FC00000, bf16 0x7FC0.
    for (std::uint32_t v : dequantize_on(kHost, s, q, false)) EXPECT_EQ(v, ref::kNaNBits);
    for (std::uint32_t v : dequantize_on(kHost, s, q, true)) EXPECT_EQ(v, 0x7FC0u);
  }
}

// ------------------------------------------------------------------ dequantize

TEST(Nvfp4, DequantizeMatchesReference) {
  for (const Nvfp4Shape s : {Nvfp4Shape{33, 47}, Nvfp4Shape{16, 16}, Nvfp4Shape{5, 3}}) {
    const auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 11, -20, 20);
    const ref::Quantized q = quantize_on(kHost, s, x);
    const auto f32 = dequantize_on(kHost, s, q, false);
    const auto b16 = dequantize_on(kHost, s, q, true);
    for (std::int64_t i = 0; i < s.numel(); ++i) {
      const float want = ref::dequantize(q, s.cols, i);
      ASSERT_EQ(f32[static_cast<std::size_t>(i)], ref::bits(want)) << i;
      ASSERT_EQ(b16[static_cast<std::size_t>(i)], mxfp8_ref::to_bf16(want)) << i;
      // Round trip: within half an E2M1 step (at most 1 at the top of the grid) of the
      // block's decode scale, or the scale-0 block (all zeros) / saturation cases.
      const double block = mxfp8_ref::e4m3_value(q.scale[static_cast<std::size_t>(s.block_index(i / s.cols, i % s.cols))]) *
                           ref::from_bits(q.decode_scale);
      if (block > 0) {
        const double err = std::fabs(want - mxfp8_ref::bf16_value(x[static_cast<std::size_t>(i)]));
        EXPECT_LE(err, 1.0 * block * (1 + 1e-6) + 1e-30) << i;
      }
    }
  }
}

// ------------------------------------------------------------------ batch, capture

TEST(Nvfp4, BatchEqualsOneCallPerTensor) {
  const std::vector<Nvfp4Shape> shapes = {{16, 16}, {17, 33}, {1, 1}, {64, 48}, {3, 301}};
  std::vector<std::vector<std::uint16_t>> xs;
  std::vector<std::unique_ptr<DevicePlanes>> outs;
  std::vector<Nvfp4Tensor> tensors;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    xs.push_back(mxfp8_test::random_bf16(shapes[t].numel(), shapes[t].cols, 20 + static_cast<std::uint32_t>(t), -40, 40));
    if (t == 2) xs.back()[0] = 0x7FC0;  // one refused tensor among finite ones
    outs.push_back(std::make_unique<DevicePlanes>(kHost, shapes[t]));
    tensors.push_back({shapes[t], xs.back().data(), outs.back()->planes()});
  }
  const Nvfp4Batch batch(tensors, kHost);
  EXPECT_EQ(batch.size(), shapes.size());
  quantize_nvfp4_batch(batch, nullptr, kHost, nullptr);
  for (std::size_t t = 0; t < shapes.size(); ++t)
    expect_same(outs[t]->get(kHost, shapes[t]), quantize_on(kHost, shapes[t], xs[t]), "tensor " + std::to_string(t));
}

TEST(Nvfp4, CapturedEqualsEager) {
  const Nvfp4Shape s{40, 24};
  auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 30, -10, 10);
  DevicePlanes out(kHost, s);
  HostStream stream;
  stream.begin_capture();
  quantize_nvfp4(s, x.data(), out.planes(), nullptr, kHost, stream.handle());
  HostGraph graph = stream.end_capture();
  EXPECT_TRUE(out.get(kHost, s).data == std::vector<std::uint8_t>(static_cast<std::size_t>(s.data_bytes()), kPoison));
  for (int rep = 0; rep < 2; ++rep) {
    const auto y = mxfp8_test::random_bf16(s.numel(), s.cols, 31 + static_cast<std::uint32_t>(rep), -10, 10);
    std::copy(y.begin(), y.end(), x.begin());  // new values in the captured buffer
    graph.replay();
    expect_same(out.get(kHost, s), reference(s, x), "replay " + std::to_string(rep));
  }
}

// ------------------------------------------------------------------ shapes and errors

template <class F>
void expect_error(F&& f, ErrorCode code, const char* needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Nvfp4, ShapesAndPlaneSizes) {
  const Nvfp4Shape s = Nvfp4Shape::of({2, 3, 17});
  EXPECT_EQ(s.rows, 6);
  EXPECT_EQ(s.cols, 17);
  EXPECT_EQ(s.data_bytes(), 51);
  EXPECT_EQ(s.scale_numel(), 2);
  EXPECT_EQ(s.amax_numel(), 3);
  EXPECT_EQ(s.block_index(5, 16), 1);
  EXPECT_EQ(nvfp4_shard_bytes({3, 8}), (Range{1, 4}));
  EXPECT_EQ(nvfp4_shard_bytes({4, 7}), (Range{2, 4}));
  EXPECT_EQ(nvfp4_shard_bytes({5, 5}).size(), 0);
  expect_error([] { Nvfp4Shape::of({7}); }, ErrorCode::InvalidArgument, "1-D");
  expect_error([] { validate(Nvfp4Shape{0, 4}); }, ErrorCode::InvalidArgument, "positive");
}

TEST(Nvfp4, ErrorsSayWhatToDo) {
  const Nvfp4Shape s{16, 16};
  std::vector<std::uint16_t> x(256, 0);
  DevicePlanes out(kHost, s);
  Nvfp4Planes missing = out.planes();
  missing.decode_scale = nullptr;
  expect_error([&] { quantize_nvfp4(s, nullptr, out.planes(), nullptr, kHost, nullptr); }, ErrorCode::InvalidArgument,
               "bf16 source is null");
  expect_error([&] { quantize_nvfp4(s, x.data(), missing, nullptr, kHost, nullptr); }, ErrorCode::InvalidArgument,
               "out.decode_scale is null");
  expect_error([&] { quantize_nvfp4(Nvfp4Shape{-1, 3}, x.data(), out.planes(), nullptr, kHost, nullptr); },
               ErrorCode::InvalidArgument, "positive");
  std::vector<float> master(256, 1.0f);
  std::vector<std::uint32_t> amax(static_cast<std::size_t>(s.amax_numel()));
  expect_error([&] { nvfp4_partial_amax(s, {10, 300}, master.data(), amax.data(), kHost, nullptr); },
               ErrorCode::OutOfRange, "not inside");
  expect_error([&] { nvfp4_partial_amax(s, {0, 4}, nullptr, amax.data(), kHost, nullptr); },
               ErrorCode::InvalidArgument, "master shard is null");
  expect_error([&] { quantize_nvfp4_shard(s, {0, 4}, master.data(), nullptr, out.planes(), kHost, nullptr); },
               ErrorCode::InvalidArgument, "amax is null");
  expect_error([] { Nvfp4Batch({}, kHost); }, ErrorCode::InvalidArgument, "empty");
  expect_error([&] { Nvfp4Batch({{s, x.data(), out.planes()}, {s, nullptr, out.planes()}}, kHost); },
               ErrorCode::InvalidArgument, "tensor 1");
  const Nvfp4Batch batch({{s, x.data(), out.planes()}}, kHost);
  expect_error([&] { quantize_nvfp4_batch(batch, nullptr, Backend::Cuda, nullptr); }, ErrorCode::InvalidArgument,
               "built for Backend::host");
}

}  // namespace
