// The bf16-output MXFP8 decode (dequantize_mxfp8 with a std::uint16_t output) on the host
// backend: against a plain reference written here (the e4m3 value times 2^(scale - 127) in
// double, one rounding to f32, then round-to-nearest-even to bf16; NaN -> 0x7FC0) for
// every one of the 256 codes under every one of the 256 scale bytes in both planes,
// against today's two-pass decode (f32 decode, then the bf16 cast) on random planes with
// partial blocks and several members, under graph capture, and its argument errors. The
// batched decode (dequantize_mxfp8_batch) equals one decode per tensor and the reference
// over a mixed list longer than one launch, runs at replay, and names a bad tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/common/convert.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_decode_common.hpp"

namespace {
using namespace shardopt;

// ---- the reference: nothing of the library
double e4m3(std::uint8_t b) {
  const int exp = (b >> 3) & 0xF, man = b & 7;
  if ((b & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double mag = exp == 0 ? std::ldexp(man, -9) : std::ldexp(8 + man, exp - 10);
  return (b & 0x80) ? -mag : mag;
}

std::uint16_t bf16_rne(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  const std::uint32_t low = u & 0xFFFFu, up = u >> 16;
  // Ties go to the even upper half; the carry of 0xFFFF -> Inf is IEEE overflow.
  if (low > 0x8000u || (low == 0x8000u && (up & 1u))) return static_cast<std::uint16_t>(up + 1);
  return static_cast<std::uint16_t>(up);
}

std::uint16_t reference(std::uint8_t data, std::uint8_t scale) {
  if (scale == 0xFF) return 0x7FC0;
  // Exact in double (|value| in [2^-136, 448 * 2^127]); the cast rounds once, to nearest
  // even. Four significant bits at most: from 2^128 on the f32 is Inf (the cast itself
  // would be undefined there).
  const double v = std::ldexp(e4m3(data), scale - 127);
  if (std::fabs(v) >= std::ldexp(1.0, 128)) return v < 0 ? 0xFF80 : 0x7F80;
  return bf16_rne(static_cast<float>(v));
}

std::vector<std::uint16_t> decode_bf16(const Mxfp8Shape& s, Mxfp8Plane plane, const std::vector<std::uint8_t>& data,
                                       const std::vector<std::uint8_t>& scale) {
  std::vector<std::uint16_t> out(data.size(), 0xDEAD);
  dequantize_mxfp8(s, plane, data.data(), scale.data(), out.data(), Backend::Host, nullptr);
  return out;
}

std::string hex(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%04X", v);
  return b;
}

// Every code under every scale byte, in both planes (test_mxfp8_decode_common.hpp).
TEST(Mxfp8DecodeBf16, EveryCodeUnderEveryScaleInBothPlanesMatchesTheReference) {
  const Mxfp8Shape s = mxfp8_decode_test::all_pairs_shape();
  std::vector<int> seen(256 * 256, 0);
  for (Mxfp8Plane plane : {Mxfp8Plane::Rowwise, Mxfp8Plane::Columnwise}) {
    const bool row = plane == Mxfp8Plane::Rowwise;
    const auto [data, scale] = mxfp8_decode_test::all_pairs(plane);
    const auto out = decode_bf16(s, plane, data, scale);
    std::fill(seen.begin(), seen.end(), 0);
    for (std::int64_t g = 0; g < 2; ++g)
      for (std::int64_t r = 0; r < 256; ++r)
        for (std::int64_t c = 0; c < 256; ++c) {
          const auto e = static_cast<std::size_t>(s.element_index(g, r, c));
          const std::uint8_t sb =
              scale[static_cast<std::size_t>(row ? s.scale_row_index(g, r, c) : s.scale_col_index(g, r, c))];
          seen[data[e] * 256 + sb] = 1;
          ASSERT_EQ(out[e], reference(data[e], sb))
              << (row ? "rowwise" : "columnwise") << " code " << hex(data[e]) << " scale " << hex(sb) << " got "
              << hex(out[e]);
        }
    for (int k = 0; k < 256 * 256; ++k) ASSERT_TRUE(seen[k]) << "pair not covered: code " << k / 256 << " scale " << k % 256;
  }
  // The reference's corners, so that it cannot drift with the code: the largest values
  // overflow to Inf, 1.0 at the unit scale 0x7F, a NaN code, and under scale 0x00
  // (2^-127) the f32 subnormals that round away or tie in bf16.
  EXPECT_EQ(reference(0x7E, 0xFE), 0x7F80);
  EXPECT_EQ(reference(0xFE, 0xFE), 0xFF80);
  EXPECT_EQ(reference(0x38, 0x7F), 0x3F80);
  EXPECT_EQ(reference(0x01, 0x00), 0x0000);  // 2^-136: an f32 subnormal, below half of bf16's 2^-133
  EXPECT_EQ(reference(0x04, 0x00), 0x0000);  // 2^-134: the tie, to even (0)
  EXPECT_EQ(reference(0x0C, 0x00), 0x0002);  // 3 * 2^-134 = 1.5 * 2^-133: the tie, to even (2 * 2^-133)
  EXPECT_EQ(reference(0x7F, 0x7F), 0x7FC0);
}

// Random planes with partial blocks (rows and cols not multiples of 32), three members,
// and a sprinkle of NaN codes and scales: the one-pass decode equals today's two-pass one
// (the f32 decode, then the bf16 cast), bitwise, except that every NaN is 0x7FC0.
TEST(Mxfp8DecodeBf16, EqualsTheF32DecodeThenTheBf16Cast) {
  for (const Mxfp8Shape s : {Mxfp8Shape{3, 45, 70}, Mxfp8Shape{1, 33, 8}, Mxfp8Shape{2, 64, 96}, Mxfp8Shape{1, 1, 1}}) {
    std::uint32_t state = 12345u + static_cast<std::uint32_t>(s.numel());
    auto next = [&state] { return state = state * 1664525u + 1013904223u; };
    for (Mxfp8Plane plane : {Mxfp8Plane::Rowwise, Mxfp8Plane::Columnwise}) {
      const bool row = plane == Mxfp8Plane::Rowwise;
      std::vector<std::uint8_t> data(static_cast<std::size_t>(s.numel()));
      std::vector<std::uint8_t> scale(static_cast<std::size_t>(row ? s.scale_row_numel() : s.scale_col_numel()));
      for (auto& d : data) d = static_cast<std::uint8_t>(next() >> 24);
      for (auto& b : scale) b = static_cast<std::uint8_t>(next() % 11 == 0 ? 0xFF : 0x60 + (next() >> 27));
      const auto out = decode_bf16(s, plane, data, scale);
      std::vector<float> f32(data.size());
      std::vector<std::uint16_t> cast(data.size());
      dequantize_mxfp8(s, plane, data.data(), scale.data(), f32.data(), Backend::Host, nullptr);
      kernels::convert(f32.data(), DType::f32, cast.data(), DType::bf16, s.numel(), Backend::Host, nullptr);
      int nans = 0;
      for (std::size_t i = 0; i < out.size(); ++i) {
        if (std::isnan(f32[i])) {
          ++nans;
          ASSERT_EQ(out[i], 0x7FC0) << i;
        } else {
          ASSERT_EQ(out[i], cast[i]) << (row ? "rowwise " : "columnwise ") << i;
        }
      }
      if (s.numel() > 100) {
        EXPECT_GT(nans, 0) << "the case lost its NaNs";
      }
    }
  }
}

// The decode is recorded by a capturing HostStream and runs at replay, with the data of
// replay time (a step's new planes).
TEST(Mxfp8DecodeBf16, CapturedDecodeRunsAtReplayOnReplayTimeData) {
  const Mxfp8Shape s{1, 32, 64};
  std::vector<std::uint8_t> data(static_cast<std::size_t>(s.numel()), 0x38);  // 1.0 at scale 0x7F
  std::vector<std::uint8_t> scale(static_cast<std::size_t>(s.scale_row_numel()), 0x7F);
  std::vector<std::uint16_t> out(data.size(), 0xDEAD);
  HostStream stream;
  stream.begin_capture();
  dequantize_mxfp8(s, Mxfp8Plane::Rowwise, data.data(), scale.data(), out.data(), Backend::Host, stream.handle());
  const HostGraph graph = stream.end_capture();
  EXPECT_EQ(out[0], 0xDEAD) << "nothing runs at capture";
  std::fill(scale.begin(), scale.end(), 0x80);  // 2.0
  graph.replay();
  for (std::uint16_t v : out) ASSERT_EQ(v, 0x4000);
}

TEST(Mxfp8DecodeBf16, BadArgumentsSayWhatToChange) {
  std::vector<std::uint8_t> data(64), scale(8);
  std::vector<std::uint16_t> out(64);
  EXPECT_THROW(dequantize_mxfp8(Mxfp8Shape{1, 0, 8}, Mxfp8Plane::Rowwise, data.data(), scale.data(), out.data(),
                                Backend::Host, nullptr),
               Error);
  for (int which = 0; which < 3; ++which) {
    try {
      dequantize_mxfp8(Mxfp8Shape{1, 8, 8}, Mxfp8Plane::Columnwise, which == 0 ? nullptr : data.data(),
                       which == 1 ? nullptr : scale.data(), which == 2 ? nullptr : out.data(), Backend::Host, nullptr);
      FAIL() << "a null pointer was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(which == 0 ? "data" : which == 1 ? "scale" : "out"), std::string::npos);
    }
  }
}

// ---- the batched decode

TEST(Mxfp8DecodeBf16, BatchEqualsOneDecodePerTensorAndTheReference) {
  const std::vector<mxfp8_decode_test::BatchCase> cases = mxfp8_decode_test::batch_cases(40);
  ASSERT_GT(cases.size(), kMxfp8DecodeLaunch);
  const auto got = mxfp8_decode_test::batch_decode(Backend::Host, cases);
  for (std::size_t t = 0; t < cases.size(); ++t) {
    const auto& c = cases[t];
    const auto one = decode_bf16(c.shape, c.plane, c.bytes.data, c.bytes.scale);
    ASSERT_EQ(got[t], mxfp8_decode_test::guarded(c, one)) << "tensor " << t << ": batch vs one decode (guards)";
    const bool row = c.plane == Mxfp8Plane::Rowwise;
    for (std::int64_t g = 0; g < c.shape.members; ++g)
      for (std::int64_t r = 0; r < c.shape.rows; ++r)
        for (std::int64_t col = 0; col < c.shape.cols; ++col) {
          const auto e = static_cast<std::size_t>(c.shape.element_index(g, r, col));
          const std::uint8_t sb = c.bytes.scale[static_cast<std::size_t>(
              row ? c.shape.scale_row_index(g, r, col) : c.shape.scale_col_index(g, r, col))];
          ASSERT_EQ(one[e], reference(c.bytes.data[e], sb)) << "tensor " << t << " element " << e;
        }
  }
}

TEST(Mxfp8DecodeBf16, CapturedBatchRunsAtReplayOnReplayTimeData) {
  const Mxfp8Shape s{1, 32, 64};
  std::vector<std::uint8_t> data(static_cast<std::size_t>(s.numel()), 0x38);  // 1.0 at scale 0x7F
  std::vector<std::uint8_t> row(static_cast<std::size_t>(s.scale_row_numel()), 0x7F);
  std::vector<std::uint8_t> col(static_cast<std::size_t>(s.scale_col_numel()), 0x7F);
  std::vector<std::uint16_t> out(2 * data.size(), 0xDEAD);
  HostStream stream;
  stream.begin_capture();
  dequantize_mxfp8_batch({{s, Mxfp8Plane::Rowwise, data.data(), row.data(), out.data()},
                          {s, Mxfp8Plane::Columnwise, data.data(), col.data(), out.data() + data.size()}},
                         Backend::Host, stream.handle());
  const HostGraph graph = stream.end_capture();
  EXPECT_EQ(out[0], 0xDEAD) << "nothing runs at capture";
  std::fill(row.begin(), row.end(), 0x80);  // 2.0
  std::fill(col.begin(), col.end(), 0x7E);  // 0.5
  graph.replay();
  for (std::size_t i = 0; i < data.size(); ++i) ASSERT_EQ(out[i], 0x4000) << i;
  for (std::size_t i = data.size(); i < out.size(); ++i) ASSERT_EQ(out[i], 0x3F00) << i;
}

TEST(Mxfp8DecodeBf16, BatchErrorsNameTheTensor) {
  std::vector<std::uint8_t> data(64), scale(8);
  std::vector<std::uint16_t> out(64);
  const Mxfp8Decode good{Mxfp8Shape{1, 8, 8}, Mxfp8Plane::Rowwise, data.data(), scale.data(), out.data()};
  auto expect_error = [](const std::vector<Mxfp8Decode>& list, const std::string& needle) {
    try {
      dequantize_mxfp8_batch(list, Backend::Host, nullptr);
      ADD_FAILURE() << "accepted; expected an error mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({}, "empty");
  for (const std::string what : {"data", "scale", "out"}) {
    Mxfp8Decode bad = good;
    if (what == "data") bad.data = nullptr;
    if (what == "scale") bad.scale = nullptr;
    if (what == "out") bad.out = nullptr;
    expect_error({good, bad}, "tensor 1: " + what + " is null");
  }
  Mxfp8Decode bad = good;
  bad.shape.cols = 0;
  expect_error({good, good, bad}, "tensor 2: ");
}

}  // namespace
