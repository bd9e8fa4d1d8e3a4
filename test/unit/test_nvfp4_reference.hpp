// test_nvfp4_reference.hpp - an independent NVFP4 oracle written from the rules of
// docs/nvfp4.md in plain float / double code and a table of the E2M1 values; it calls
// nothing of the library (the bf16 and E4M3 helpers are the MXFP8 oracle's, also test
// code). Shared by test/unit/test_nvfp4*.cpp and test/gpu/test_nvfp4_gpu.cpp.
//
//   amax   = max |x| over the tensor (fp32; exact, the x are bf16);
//   S_enc  = min(2688.f / amax, FLT_MAX), 1 when amax == 0 or S_enc == 0; S_dec = 1.f / S_enc;
//   scale  = e4m3(block_amax * (S_enc * (1.f / 6))), nearest even, saturating to 448;
//   code   = e2m1(x * min(1.f / (float(scale) * S_dec), FLT_MAX)), nearest even on
//            {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating to 6; sign << 3 | index;
//   bytes  = element 2i in the low nibble of byte i, 2i + 1 in the high nibble;
//   NaN / Inf anywhere: amax and S_dec NaN, every scale 0x7F, every byte 0.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "unit/test_mxfp8_reference.hpp"

namespace nvfp4_ref {

inline constexpr std::uint32_t kNaNBits = 0x7FC00000u;

/// The non-negative E2M1 values, index = code & 7.
inline const std::vector<double>& e2m1_table() {
  static const std::vector<double> t = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return t;
}

/// Value of an E2M1 code (4 bits).
inline double e2m1_value(std::uint8_t code) {
  const double v = e2m1_table()[code & 7];
  return (code & 8) ? -v : v;
}

/// Nearest-even E2M1 code of a value, saturating to +-6 (the sign kept for zeros).
inline std::uint8_t to_e2m1(double v) {
  const std::uint8_t sign = std::signbit(v) ? 8 : 0;
  const double a = std::fabs(v);
  if (a >= 6.0) return static_cast<std::uint8_t>(sign | 7);
  int overflow = 0;
  // Index parity is the mantissa bit, so "even index" is "even mantissa".
  const int code = mxfp8_ref::nearest_code(e2m1_table(), a, 8.0, &overflow);
  return static_cast<std::uint8_t>(sign | (overflow ? 7 : code));
}

inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// The outputs of a quantization, on the host (the two fp32 values as bit patterns, so
/// that == compares NaNs too).
struct Quantized {
  std::vector<std::uint8_t> data, scale;
  std::uint32_t amax = 0, decode_scale = 0;
  bool operator==(const Quantized&) const = default;
};

/// S_enc of a finite amax. The fp32 quotient is the double quotient rounded to float
/// (still correctly rounded: for a division, rounding twice is harmless when the wider
/// format has 53 >= 2 * 24 + 2 bits); a double above FLT_MAX is a float
/// quotient that rounds to FLT_MAX or overflows, which the rule clamps to FLT_MAX. (Not
/// written as min(2688.f / amax, FLT_MAX) followed by the zero tests: g++ 13.3 at -O2
/// compiled that to S_enc = 1 wherever the quotient overflows.)
inline float encode_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const double q = 2688.0 / static_cast<double>(amax);
  if (q > static_cast<double>(FLT_MAX)) return FLT_MAX;
  const float s = static_cast<float>(q);
  return s == 0.0f ? 1.0f : s;
}

/// Reference quantization of [rows, cols] bf16 values.
inline Quantized quantize(std::int64_t rows, std::int64_t cols, const std::vector<std::uint16_t>& x) {
  const std::int64_t br = (rows + 15) / 16, bc = (cols + 15) / 16;
  Quantized q;
  q.data.assign(static_cast<std::size_t>((rows * cols + 1) / 2), 0);
  q.scale.assign(static_cast<std::size_t>(br * bc), 0x7F);
  float amax = 0.0f;
  bool finite = true;
  for (std::uint16_t h : x) {
    const double v = mxfp8_ref::bf16_value(h);
    if (!std::isfinite(v)) finite = false;
    else amax = std::max(amax, static_cast<float>(std::fabs(v)));
  }
  if (!finite) {
    q.amax = q.decode_scale = kNaNBits;
    return q;
  }
  const float s_enc = encode_scale(amax);
  const float s_dec = 1.0f / s_enc;
  q.amax = bits(amax);
  q.decode_scale = bits(s_dec);
  for (std::int64_t b = 0; b < br * bc; ++b) {
    const std::int64_t r0 = b / bc * 16, c0 = b % bc * 16;
    const std::int64_t r1 = std::min(rows, r0 + 16), c1 = std::min(cols, c0 + 16);
    float block_amax = 0.0f;
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t c = c0; c < c1; ++c)
        block_amax = std::max(block_amax, static_cast<float>(std::fabs(mxfp8_ref::bf16_value(x[r * cols + c]))));
    const std::uint8_t scale = mxfp8_ref::to_e4m3(block_amax * (s_enc * (1.0f / 6)));
    q.scale[static_cast<std::size_t>(b)] = scale;
    const float multiplier = std::min(1.0f / (static_cast<float>(mxfp8_ref::e4m3_value(scale)) * s_dec), FLT_MAX);
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::int64_t i = r * cols + c;
        const float y = static_cast<float>(mxfp8_ref::bf16_value(x[i])) * multiplier;
        q.data[static_cast<std::size_t>(i / 2)] |= static_cast<std::uint8_t>(to_e2m1(y) << (4 * (i % 2)));
      }
  }
  return q;
}

/// Reference dequantized element i of a quantized [rows, cols] tensor:
/// e2m1 * (float(scale) * S_dec) in fp32.
inline float dequantize(const Quantized& q, std::int64_t cols, std::int64_t i) {
  const std::int64_t r = i / cols, c = i % cols, bc = (cols + 15) / 16;
  const std::uint8_t code = static_cast<std::uint8_t>(q.data[static_cast<std::size_t>(i / 2)] >> (4 * (i % 2))) & 0xF;
  const std::uint8_t scale = q.scale[static_cast<std::size_t>(r / 16 * bc + c / 16)];
  const float block = static_cast<float>(mxfp8_ref::e4m3_value(scale)) * from_bits(q.decode_scale);
  return static_cast<float>(e2m1_value(code)) * block;
}

}  // namespace nvfp4_ref
