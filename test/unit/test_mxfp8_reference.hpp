// test_mxfp8_reference.hpp - an independent MXFP8 oracle written from the DESIGN.md
// rules in double precision (ldexp, exact comparisons); it calls nothing of the
// library. Shared by test/unit/test_mxfp8*.cpp and test/gpu/test_mxfp8*.cpp.
//
//   bf16(master): round to nearest, ties to even (NaN stays NaN).
//   amax: max |x| over the block; NaN anywhere -> NaN.
//   scale byte: smallest e with 448 * 2^e >= amax, clamped to [-127, 127], byte e + 127;
//               zero block 0x00, NaN 0xFF, Inf 0xFE.
//   element: x / 2^e rounded to nearest even E4M3, saturating at 448; every element of a
//            NaN block is 0x7F.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace mxfp8_ref {

/// Value of a bf16 bit pattern: sign, 8 exponent bits (bias 127), 7 mantissa bits.
inline double bf16_value(std::uint16_t h) {
  const int sign = h >> 15, exp = (h >> 7) & 0xFF, man = h & 0x7F;
  double v;
  if (exp == 0xFF) {
    v = man == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), -133);
  } else {
    v = std::ldexp(1.0 + man / 128.0, exp - 127);
  }
  return sign ? -v : v;
}

/// All finite non-negative bf16 values, ascending (index = bit pattern).
inline const std::vector<double>& bf16_table() {
  static const std::vector<double> t = [] {
    std::vector<double> v;
    for (int h = 0; h <= 0x7F7F; ++h) v.push_back(bf16_value(static_cast<std::uint16_t>(h)));
    return v;
  }();
  return t;
}

/// Nearest code of a sorted table of non-negative values, ties to the even code;
/// `beyond` is the value just past the last entry (used for the last midpoint).
inline int nearest_code(const std::vector<double>& table, double a, double beyond, int* overflow) {
  *overflow = 0;
  const auto it = std::upper_bound(table.begin(), table.end(), a);
  if (it == table.begin()) return 0;
  const int lo = static_cast<int>(it - table.begin()) - 1;
  const double hi_value = it == table.end() ? beyond : *it;
  const double mid = (table[lo] + hi_value) / 2;  // exact: neighbours differ by a power of two times a small int
  int code;
  if (a < mid) code = lo;
  else if (a > mid) code = lo + 1;
  else code = (lo % 2 == 0) ? lo : lo + 1;
  if (code == static_cast<int>(table.size())) *overflow = 1;
  return code;
}

/// f32 -> bf16 bits, round to nearest even; overflow -> Inf; NaN -> quiet NaN.
inline std::uint16_t to_bf16(float f) {
  const double d = f;
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(d)) return static_cast<std::uint16_t>(sign | 0x7FC0);
  if (std::isinf(d)) return static_cast<std::uint16_t>(sign | 0x7F80);
  int overflow = 0;
  const double beyond = std::ldexp(1.0, 128);  // the next binade's first value
  const int code = nearest_code(bf16_table(), std::fabs(d), beyond, &overflow);
  if (overflow) return static_cast<std::uint16_t>(sign | 0x7F80);
  return static_cast<std::uint16_t>(sign | code);
}

/// Value of an e4m3 code (no Inf; 0x7F / 0xFF are NaN).
inline double e4m3_value(std::uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xF, man = b & 7;
  if ((b & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double v = exp == 0 ? std::ldexp(static_cast<double>(man), -9) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return sign ? -v : v;
}

/// The finite non-negative e4m3 values, ascending (index = code 0..0x7E).
inline const std::vector<double>& e4m3_table() {
  static const std::vector<double> t = [] {
    std::vector<double> v;
    for (int c = 0; c <= 0x7E; ++c) v.push_back(e4m3_value(static_cast<std::uint8_t>(c)));
    return v;
  }();
  return t;
}

/// Saturating RNE double -> e4m3 (|v| beyond 448, Inf included, -> 448).
inline std::uint8_t to_e4m3(double v) {
  const std::uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  if (a >= 448.0) return static_cast<std::uint8_t>(sign | 0x7E);
  int overflow = 0;
  const int code = nearest_code(e4m3_table(), a, 480.0, &overflow);
  return static_cast<std::uint8_t>(sign | (overflow ? 0x7E : code));
}

/// Scale byte of a block amax (non-negative, or NaN / Inf).
inline std::uint8_t scale_of(double amax) {
  if (std::isnan(amax)) return 0xFF;
  if (std::isinf(amax)) return 0xFE;
  if (amax == 0.0) return 0x00;
  int e = std::max(-127, std::ilogb(amax) - 9);  // 448 * 2^(ilogb - 9) < amax: a lower bound
  while (std::ldexp(448.0, e) < amax) ++e;
  return static_cast<std::uint8_t>(std::min(e, 127) + 127);
}

/// One element of a block with scale byte `scale`.
inline std::uint8_t element_of(std::uint16_t x, std::uint8_t scale) {
  if (scale == 0xFF) return 0x7F;
  return to_e4m3(std::ldexp(bf16_value(x), 127 - scale));  // exact in double
}

/// Amax of a set of bf16 values with NaN propagation.
struct Amax {
  double value = 0.0;
  void add(std::uint16_t x) {
    const double a = std::fabs(bf16_value(x));
    if (std::isnan(a) || std::isnan(value)) value = std::numeric_limits<double>::quiet_NaN();
    else value = std::max(value, a);
  }
};

/// The four outputs of a quantization, on the host.
struct Quantized {
  std::vector<std::uint8_t> data_row, scale_row, data_col, scale_col;
  bool operator==(const Quantized&) const = default;
};

/// Reference quantization of G members of [rows, cols] bf16 values (contiguous).
inline Quantized quantize(std::int64_t members, std::int64_t rows, std::int64_t cols,
                          const std::vector<std::uint16_t>& x) {
  const std::int64_t rb = (cols + 31) / 32, cb = (rows + 31) / 32;
  Quantized q;
  q.data_row.resize(x.size());
  q.data_col.resize(x.size());
  q.scale_row.resize(static_cast<std::size_t>(members * rows * rb));
  q.scale_col.resize(static_cast<std::size_t>(members * cb * cols));
  for (std::int64_t g = 0; g < members; ++g) {
    const std::int64_t base = g * rows * cols;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t b = 0; b < rb; ++b) {
        Amax amax;
        const std::int64_t c1 = std::min(cols, 32 * b + 32);
        for (std::int64_t c = 32 * b; c < c1; ++c) amax.add(x[base + r * cols + c]);
        const std::uint8_t s = scale_of(amax.value);
        q.scale_row[(g * rows + r) * rb + b] = s;
        for (std::int64_t c = 32 * b; c < c1; ++c) q.data_row[base + r * cols + c] = element_of(x[base + r * cols + c], s);
      }
    for (std::int64_t b = 0; b < cb; ++b)
      for (std::int64_t c = 0; c < cols; ++c) {
        Amax amax;
        const std::int64_t r1 = std::min(rows, 32 * b + 32);
        for (std::int64_t r = 32 * b; r < r1; ++r) amax.add(x[base + r * cols + c]);
        const std::uint8_t s = scale_of(amax.value);
        q.scale_col[(g * cb + b) * cols + c] = s;
        for (std::int64_t r = 32 * b; r < r1; ++r) q.data_col[base + r * cols + c] = element_of(x[base + r * cols + c], s);
      }
  }
  return q;
}

/// Reference dequantized value: fl32(e4m3 * 2^(scale - 127)), 0x00 -> 2^-127, 0xFF -> NaN.
inline float dequantize(std::uint8_t data, std::uint8_t scale) {
  if (scale == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(std::ldexp(e4m3_value(data), scale - 127));  // exact product, one rounding
}

/// TransformerEngine's RCEIL rule as a model: fl32(amax * fl32(1/448)), then the
/// ceil-to-power-of-two of its software float_to_e8m0 (subnormal t <= 2^-127 -> 0,
/// t in (2^-127, 2^-126] -> 1; NaN -> 0xFF, Inf -> 0xFE).
inline std::uint8_t te_rceil_scale(std::uint16_t amax_bits) {
  const double a = bf16_value(amax_bits);
  if (std::isnan(a)) return 0xFF;
  if (std::isinf(a)) return 0xFE;
  const float r = 1.0f / 448.0f;
  const float t = static_cast<float>(a * static_cast<double>(r));  // the double product is exact
  if (t == 0.0f) return 0x00;
  std::uint32_t bits;
  std::memcpy(&bits, &t, 4);
  std::uint32_t exponent = bits >> 23;
  const std::uint32_t mantissa = bits & 0x7FFFFF;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

}  // namespace mxfp8_ref
