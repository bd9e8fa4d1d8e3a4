// Conversions against an independent reference: every finite value of the target
// format is enumerated in double precision, and rounding is decided by exact
// comparisons with the midpoints between neighbours (ties to the even code).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "shardopt/numerics.hpp"

namespace {
using namespace shardopt;

float bits_to_f(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t f_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A small binary float format described by its fields, decoded with ldexp in double.
struct FormatRef {
  int ebits, mbits;
  bool ieee_inf;     // exponent all-ones is Inf/NaN (f16, e5m2); else only mantissa all-ones is NaN (e4m3)
  bool saturating;   // overflow -> max finite (fp8) instead of Inf (f16)
  int bias() const { return (1 << (ebits - 1)) - 1; }
  int magnitude_codes() const { return 1 << (ebits + mbits); }
  bool is_nan(std::uint32_t mag) const {
    const std::uint32_t emax = (1u << ebits) - 1, mmask = (1u << mbits) - 1;
    if (ieee_inf) return (mag >> mbits) == emax && (mag & mmask) != 0;
    return mag == ((emax << mbits) | mmask);
  }
  bool is_inf(std::uint32_t mag) const {
    return ieee_inf && (mag >> mbits) == (1u << ebits) - 1 && (mag & ((1u << mbits) - 1)) == 0;
  }
  double value(std::uint32_t mag) const {  // finite magnitudes only
    const int e = static_cast<int>(mag >> mbits);
    const double m = static_cast<double>(mag & ((1u << mbits) - 1));
    if (e == 0) return std::ldexp(m, 1 - bias() - mbits);
    return std::ldexp(1.0 + m / std::ldexp(1.0, mbits), e - bias());
  }
  std::vector<std::uint32_t> finite_codes() const {
    std::vector<std::uint32_t> out;
    for (int c = 0; c < magnitude_codes(); ++c)
      if (!is_nan(static_cast<std::uint32_t>(c)) && !is_inf(static_cast<std::uint32_t>(c)))
        out.push_back(static_cast<std::uint32_t>(c));
    return out;  // increasing in value
  }
  // Values of finite_codes(), computed once.
  const std::vector<double>& values() const {
    if (cache.empty())
      for (auto c : finite_codes()) cache.push_back(value(c));
    return cache;
  }
  mutable std::vector<double> cache;
  // Reference rounding of |x| (finite or Inf) to a magnitude code; kInfCode marks overflow to Inf.
  static constexpr std::uint32_t kInfCode = 0xFFFFFFFF;
  std::uint32_t round(double ax) const {
    static thread_local const FormatRef* last = nullptr;
    static thread_local std::vector<std::uint32_t> codes;
    if (last != this) { codes = finite_codes(); last = this; }
    const double maxv = value(codes.back());
    if (std::isinf(ax)) return saturating ? codes.back() : kInfCode;
    // Candidate beyond max: the value the next exponent step would have.
    const double beyond = maxv + (maxv - value(codes[codes.size() - 2]));
    if (ax >= maxv) {
      if (saturating) return codes.back();
      const double mid = (maxv + beyond) / 2;
      if (ax < mid) return codes.back();
      // beyond has an even code (all-ones mantissa + 1), so a tie goes to Inf.
      return kInfCode;
    }
    const auto& vals = values();
    const std::size_t hi = static_cast<std::size_t>(std::lower_bound(vals.begin(), vals.end(), ax) - vals.begin());
    if (vals[hi] == ax) return codes[hi];
    const std::size_t lo = hi - 1;
    const double mid = (vals[lo] + vals[hi]) / 2;
    if (ax < mid) return codes[lo];
    if (ax > mid) return codes[hi];
    return (codes[lo] & 1u) == 0 ? codes[lo] : codes[hi];
  }
};

const FormatRef kF16{5, 10, true, false, {}};
const FormatRef kE4M3{4, 3, false, true, {}};
const FormatRef kE5M2{5, 2, true, true, {}};
const FormatRef kBF16{8, 7, true, false, {}};

// Expected encoding of float x in the format (sign bit position = total bits - 1).
std::uint32_t expected(const FormatRef& fmt, float x, std::uint32_t nan_code, bool nan_keeps_sign) {
  const int total = 1 + fmt.ebits + fmt.mbits;
  const std::uint32_t sign = std::signbit(x) ? (1u << (total - 1)) : 0u;
  if (std::isnan(x)) return nan_code | (nan_keeps_sign ? sign : 0u);
  const std::uint32_t mag = fmt.round(std::fabs(static_cast<double>(x)));
  if (mag == FormatRef::kInfCode) return sign | (((1u << fmt.ebits) - 1) << fmt.mbits);
  return sign | mag;
}

// Interesting floats: every midpoint between neighbours of the target and one ulp
// either side, the neighbours themselves, and values around max.
std::vector<float> boundary_floats(const FormatRef& fmt) {
  std::vector<float> out;
  const auto codes = fmt.finite_codes();
  for (std::size_t i = 0; i + 1 < codes.size(); ++i) {
    const double a = fmt.value(codes[i]), b = fmt.value(codes[i + 1]);
    const float mid = static_cast<float>((a + b) / 2);  // exact: few mantissa bits
    for (float v : {static_cast<float>(a), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      out.push_back(v);
      out.push_back(-v);
    }
  }
  const float maxv = static_cast<float>(fmt.value(codes.back()));
  for (float v : {maxv, std::nextafter(maxv, 1e30f), maxv * 1.03125f, maxv * 1.0625f, maxv * 2.0f, 1e30f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), 0.0f}) {
    out.push_back(v);
    out.push_back(-v);
  }
  return out;
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    float f = bits_to_f(rng());
    if (!std::isnan(f)) out.push_back(f);
  }
  return out;
}

template <class Fn>
void check_format(const FormatRef& fmt, Fn convert, std::uint32_t nan_code, bool nan_keeps_sign) {
  std::vector<float> inputs = boundary_floats(fmt);
  // Random values concentrated in the format's range, and arbitrary bit patterns.
  std::mt19937 rng(1234);
  const double maxv = fmt.value(fmt.finite_codes().back());
  std::uniform_real_distribution<double> expo(-std::log2(maxv) - fmt.bias() - fmt.mbits - 3, std::log2(maxv) + 2);
  for (int i = 0; i < 200000; ++i) {
    float v = static_cast<float>(std::exp2(expo(rng)));
    inputs.push_back((rng() & 1) ? v : -v);
  }
  auto r = random_floats(100000, 99);
  inputs.insert(inputs.end(), r.begin(), r.end());
  inputs.push_back(std::numeric_limits<float>::quiet_NaN());
  inputs.push_back(-std::numeric_limits<float>::quiet_NaN());
  int failures = 0;
  for (float x : inputs) {
    const std::uint32_t want = expected(fmt, x, nan_code, nan_keeps_sign);
    const std::uint32_t got = convert(x);
    if (std::isnan(x) && nan_keeps_sign) {
      // NaN payloads may differ; the result must be a NaN with the input's sign.
      const int total = 1 + fmt.ebits + fmt.mbits;
      EXPECT_TRUE(fmt.is_nan(got & ((1u << (total - 1)) - 1))) << std::hex << got;
      EXPECT_EQ(got >> (total - 1), want >> (total - 1));
      continue;
    }
    if (got != want && ++failures < 20) {
      ADD_FAILURE() << "x=" << x << " (0x" << std::hex << f_to_bits(x) << ") got 0x" << got << " want 0x" << want;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(Numerics, Bf16AllCodesRoundTrip) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const float f = num::bf16_to_f32(static_cast<std::uint16_t>(c));
    const std::uint16_t back = num::f32_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(num::bf16_to_f32(back)));
      EXPECT_EQ(back & 0x8000u, c & 0x8000u);
    } else {
      ASSERT_EQ(back, c) << std::hex << c;
      // Decode equals the field-wise reference value.
      const std::uint32_t mag = c & 0x7FFFu;
      const double ref = kBF16.is_inf(mag) ? std::numeric_limits<double>::infinity() : kBF16.value(mag);
      EXPECT_EQ(static_cast<double>(std::fabs(f)), ref) << std::hex << c;
    }
  }
}

TEST(Numerics, Bf16RoundsToNearestEven) {
  check_format(kBF16, [](float x) { return static_cast<std::uint32_t>(num::f32_to_bf16(x)); }, 0x7FC0, true);
  // Explicit ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1.0).
  EXPECT_EQ(num::f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80u);
  EXPECT_EQ(num::f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82u);
  // Overflow rounds to Inf.
  EXPECT_EQ(num::f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80u);
}

TEST(Numerics, F16MatchesReference) {
  check_format(kF16, [](float x) { return static_cast<std::uint32_t>(num::f32_to_f16(x)); }, 0x7E00, true);
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const float f = num::f16_to_f32(static_cast<std::uint16_t>(c));
    const std::uint32_t mag = c & 0x7FFFu;
    if (kF16.is_nan(mag)) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    EXPECT_EQ(num::f32_to_f16(f), c) << std::hex << c;
    const double ref = kF16.is_inf(mag) ? std::numeric_limits<double>::infinity() : kF16.value(mag);
    EXPECT_EQ(static_cast<double>(std::fabs(f)), ref) << std::hex << c;
  }
  EXPECT_EQ(num::f32_to_f16(65520.0f), 0x7C00u);  // tie at max rounds to Inf
  EXPECT_EQ(num::f32_to_f16(65519.0f), 0x7BFFu);
  EXPECT_EQ(num::f32_to_f16(std::ldexp(1.0f, -25)), 0x0000u);      // tie at half the min subnormal -> 0
  EXPECT_EQ(num::f32_to_f16(std::ldexp(1.5f, -25)), 0x0001u);
}

TEST(Numerics, E4M3AllCodesAndRounding) {
  int nans = 0;
  for (std::uint32_t c = 0; c < 256; ++c) {
    const float f = num::e4m3_to_f32(static_cast<std::uint8_t>(c));
    const std::uint32_t mag = c & 0x7Fu;
    if (kE4M3.is_nan(mag)) {
      ++nans;
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    EXPECT_EQ(static_cast<double>(std::fabs(f)), kE4M3.value(mag)) << c;
    EXPECT_EQ(std::signbit(f), (c & 0x80u) != 0);
    EXPECT_EQ(num::f32_to_e4m3(f), c) << c;
  }
  EXPECT_EQ(nans, 2);  // 0x7F and 0xFF only: e4m3 has no Inf
  check_format(kE4M3, [](float x) { return static_cast<std::uint32_t>(num::f32_to_e4m3(x)); }, 0x7F, false);
  EXPECT_EQ(num::f32_to_e4m3(448.0f), 0x7Eu);
  EXPECT_EQ(num::f32_to_e4m3(464.0f), 0x7Eu);  // would round to 480: saturates
  EXPECT_EQ(num::f32_to_e4m3(1e9f), 0x7Eu);
  EXPECT_EQ(num::f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFEu);
  EXPECT_EQ(num::f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01u);        // min subnormal
  EXPECT_EQ(num::f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00u);       // tie -> even (0)
  EXPECT_EQ(num::f32_to_e4m3(std::ldexp(3.0f, -10)), 0x02u);       // tie 1.5 ulp -> 2
  EXPECT_EQ(num::f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7Fu);
}

TEST(Numerics, E5M2AllCodesAndRounding) {
  for (std::uint32_t c = 0; c < 256; ++c) {
    const float f = num::e5m2_to_f32(static_cast<std::uint8_t>(c));
    const std::uint32_t mag = c & 0x7Fu;
    if (kE5M2.is_nan(mag)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    if (kE5M2.is_inf(mag)) {
      EXPECT_TRUE(std::isinf(f)) << c;
      EXPECT_EQ(num::f32_to_e5m2(f), (c & 0x80u) | 0x7Bu);  // Inf saturates to max
      continue;
    }
    EXPECT_EQ(static_cast<double>(std::fabs(f)), kE5M2.value(mag)) << c;
    EXPECT_EQ(num::f32_to_e5m2(f), c) << c;
  }
  check_format(kE5M2, [](float x) { return static_cast<std::uint32_t>(num::f32_to_e5m2(x)); }, 0x7F, false);
  EXPECT_EQ(num::f32_to_e5m2(57344.0f), 0x7Bu);
  EXPECT_EQ(num::f32_to_e5m2(1e6f), 0x7Bu);
  EXPECT_EQ(num::f32_to_e5m2(std::ldexp(1.0f, -16)), 0x01u);
}

TEST(Numerics, E8M0EdgeCodes) {
  EXPECT_EQ(num::f32_bits(num::e8m0_to_f32(0x00)), 0x00400000u);  // 2^-127, not zero
  EXPECT_EQ(num::e8m0_to_f32(0x00), std::ldexp(1.0f, -127));
  EXPECT_EQ(num::e8m0_to_f32(0x7F), 1.0f);
  EXPECT_EQ(num::e8m0_to_f32(0xFE), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(num::e8m0_to_f32(0xFF)));
  for (int c = 1; c < 255; ++c) EXPECT_EQ(num::e8m0_to_f32(static_cast<std::uint8_t>(c)), std::ldexp(1.0f, c - 127));
  // Encoding: round up to a power of two, clamp, specials.
  EXPECT_EQ(num::f32_to_e8m0(1.0f), 0x7Fu);
  EXPECT_EQ(num::f32_to_e8m0(1.0000001f), 0x80u);
  EXPECT_EQ(num::f32_to_e8m0(0.75f), 0x7Fu);
  EXPECT_EQ(num::f32_to_e8m0(0.0f), 0x00u);
  EXPECT_EQ(num::f32_to_e8m0(std::ldexp(1.0f, -127)), 0x00u);
  EXPECT_EQ(num::f32_to_e8m0(std::ldexp(1.0f, -130)), 0x00u);
  EXPECT_EQ(num::f32_to_e8m0(std::ldexp(1.5f, -127)), 0x01u);
  EXPECT_EQ(num::f32_to_e8m0(std::ldexp(1.0f, 127)), 0xFEu);
  EXPECT_EQ(num::f32_to_e8m0(std::numeric_limits<float>::max()), 0xFEu);
  EXPECT_EQ(num::f32_to_e8m0(std::numeric_limits<float>::infinity()), 0xFEu);
  EXPECT_EQ(num::f32_to_e8m0(std::numeric_limits<float>::quiet_NaN()), 0xFFu);
  // Every finite positive f32 against the definition: smallest 2^k >= x, k in [-127, 127].
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::fabs(bits_to_f(rng()));
    if (std::isnan(x) || std::isinf(x)) continue;
    int k = -127;
    while (k < 127 && std::ldexp(1.0, k) < static_cast<double>(x)) ++k;
    ASSERT_EQ(num::f32_to_e8m0(x), static_cast<std::uint32_t>(k + 127)) << x;
  }
}

TEST(Numerics, GenericEncodeDecodeAgree) {
  for (float x : {0.0f, -1.5f, 3.25f, 1e-3f, 300.0f}) {
    EXPECT_EQ(num::encode(DType::bf16, x), num::f32_to_bf16(x));
    EXPECT_EQ(num::encode(DType::f16, x), num::f32_to_f16(x));
    EXPECT_EQ(num::encode(DType::e4m3, x), num::f32_to_e4m3(x));
    EXPECT_EQ(num::encode(DType::e5m2, x), num::f32_to_e5m2(x));
    EXPECT_EQ(num::decode(DType::f32, num::encode(DType::f32, x)), x);
  }
  EXPECT_EQ(size_of(DType::f32), 4u);
  EXPECT_EQ(size_of(DType::e8m0), 1u);
  EXPECT_EQ(size_of(DType::u32), 4u);
  EXPECT_EQ(parse_dtype("u32"), DType::u32);
  EXPECT_FALSE(is_float_storage(DType::u32));
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_STREQ(to_string(DType::e5m2), "e5m2");
}

}  // namespace
