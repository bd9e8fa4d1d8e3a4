// shardopt/numerics.hpp - exact conversions between f32 and the narrow types.
//
// Every function here is plain integer arithmetic on bit patterns, usable from
// host code and from CUDA device code alike (__host__ __device__ under nvcc), so
// the CUDA kernels and their host twins round identically by construction.
//
// Rules:
//  * f32 -> bf16 / f16 / e4m3 / e5m2: round to nearest, ties to even; subnormals
//    of the target are produced exactly.
//  * f16 is IEEE: overflow rounds to Inf. e4m3 and e5m2 saturate: finite values
//    beyond the largest finite value and +-Inf become +-max (448, 57344).
//  * NaN stays NaN: bf16/f16 keep the sign and set the quiet bit; e4m3 -> 0x7F,
//    e5m2 -> 0x7F (sign dropped, the canonical NaN).
//  * e8m0 (a power-of-two scale 2^(code-127)): 0xFF decodes to NaN, 0x00 decodes to
//    2^-127 (not zero). f32_to_e8m0 rounds |x| up to the next power of two (RCEIL),
//    clamps to [2^-127, 2^127] (Inf -> 0xFE), and maps NaN to 0xFF.
#pragma once

#include <cstdint>
#include <cstring>

#include "shardopt/dtype.hpp"

#if defined(__CUDACC__)
#define SHARDOPT_HD __host__ __device__ __forceinline__
#else
#define SHARDOPT_HD inline
#endif

namespace shardopt::num {

/// Bit pattern of a float.
SHARDOPT_HD std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// Float with the given bit pattern.
SHARDOPT_HD float f32_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

namespace detail {

/// Rounds a finite, non-negative f32 magnitude (bits `a`, sign cleared) to a binary
/// format with EBITS exponent bits and MBITS mantissa bits (IEEE-style bias and
/// subnormals), ties to even. Returns the target's magnitude code; a code past the
/// format's largest exponent means overflow, which the caller resolves.
template <int EBITS, int MBITS>
SHARDOPT_HD std::uint32_t round_magnitude(std::uint32_t a) {
  constexpr int kBias = (1 << (EBITS - 1)) - 1;
  const int e32 = static_cast<int>(a >> 23);
  if (e32 == 0) return 0;  // f32 subnormals are far below half the smallest target subnormal
  const int e = e32 - 127;
  const std::uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;  // value = sig * 2^(e-23)
  const int target_e = e < 1 - kBias ? 1 - kBias : e;     // exponent that sets the spacing
  const int shift = (target_e - MBITS) - (e - 23);         // low bits to drop (> 0)
  if (shift >= 25) return 0;                               // below half the smallest spacing
  std::uint32_t q = sig >> shift;
  const std::uint32_t rem = sig & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  // For subnormal spacing target_e + kBias - 1 == 0 and the code is q itself; a carry
  // of q into 2^(MBITS+1) moves into the exponent field by the addition.
  return (static_cast<std::uint32_t>(target_e + kBias - 1) << MBITS) + q;
}

/// Decodes a magnitude code of a binary format with the given field widths (no
/// special values: the caller handles Inf/NaN codes first).
template <int EBITS, int MBITS>
SHARDOPT_HD float decode_magnitude(std::uint32_t code) {
  constexpr int kBias = (1 << (EBITS - 1)) - 1;
  const std::uint32_t exp = code >> MBITS;
  const std::uint32_t man = code & ((1u << MBITS) - 1u);
  if (exp == 0) {
    // Subnormal: man * 2^(1 - bias - MBITS); exact in f32 for every format here.
    return static_cast<float>(man) * f32_from_bits(static_cast<std::uint32_t>(127 + 1 - kBias - MBITS) << 23);
  }
  return f32_from_bits((static_cast<std::uint32_t>(static_cast<int>(exp) - kBias + 127) << 23) |
                       (man << (23 - MBITS)));
}

}  // namespace detail

// ------------------------------------------------------------------------ bf16

/// bf16 bits -> f32 (exact).
SHARDOPT_HD float bf16_to_f32(std::uint16_t h) { return f32_from_bits(static_cast<std::uint32_t>(h) << 16); }

/// f32 -> bf16 bits, round to nearest even; NaN stays NaN (quiet, sign kept).
SHARDOPT_HD std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// ------------------------------------------- bf16 parameter + 16-bit remainder = fp32 master
//
// An fp32 master x (bits X = hi:lo, 16 bits each) is kept as its bf16 parameter p and a
// 16-bit remainder r = lo, with p = hi + (lo >= 0x8000): x rounded to the nearest bf16,
// ties away from zero. The pair rebuilds x exactly: X = ((p - (r >> 15)) << 16) | r.
// Ties to even cannot be kept: 65,537 fp32 values round to each even bf16 (from
// halfway below to halfway above), one more than 16 bits can tell apart, so the one
// difference from f32_to_bf16 is the exact tie above an even bf16 (lo == 0x8000, hi
// even), which rounds up here. Example: x = 1.00390625 (0x3F808000, exactly halfway
// between bf16 1.0 = 0x3F80 and 1.0078125 = 0x3F81): p = 0x3F81, r = 0x8000, and
// ((0x3F81 - 1) << 16) | 0x8000 = 0x3F808000 again; f32_to_bf16 gives 0x3F80. A NaN
// keeps its sign and sets the quiet bit, as f32_to_bf16 does, and rebuilds as a NaN.

/// The bf16 parameter bits of master x in the parameter + remainder split.
SHARDOPT_HD std::uint16_t remainder_split_param(float x) {
  const std::uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u >> 16) + ((u >> 15) & 1u));
}

/// The 16-bit remainder of master x: its low half.
SHARDOPT_HD std::uint16_t remainder_split_low(float x) { return static_cast<std::uint16_t>(f32_bits(x) & 0xFFFFu); }

/// The master rebuilt from its bf16 parameter bits and remainder (exact for every
/// non-NaN master; a NaN parameter rebuilds as a NaN).
SHARDOPT_HD float remainder_join(std::uint16_t param, std::uint16_t remainder) {
  const std::uint32_t hi = static_cast<std::uint32_t>(param) - (static_cast<std::uint32_t>(remainder) >> 15);
  return f32_from_bits(((hi & 0xFFFFu) << 16) | remainder);
}

// ------------------------------------------------------------------------ f16

/// f16 bits -> f32 (exact).
SHARDOPT_HD float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t mag = h & 0x7FFFu;
  if (mag >= 0x7C00u) {  // Inf or NaN
    return f32_from_bits(sign | 0x7F800000u | ((mag & 0x3FFu) << 13));
  }
  return f32_from_bits(sign | f32_bits(detail::decode_magnitude<5, 10>(mag)));
}

/// f32 -> f16 bits, round to nearest even; overflow -> Inf; NaN -> quiet NaN.
SHARDOPT_HD std::uint16_t f32_to_f16(float f) {
  const std::uint32_t u = f32_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a == 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  std::uint32_t code = detail::round_magnitude<5, 10>(a);
  if (code >= 0x7C00u) code = 0x7C00u;
  return static_cast<std::uint16_t>(sign | code);
}

// ------------------------------------------------------------------------ e4m3

/// Largest finite e4m3 value.
inline constexpr float kE4M3Max = 448.0f;
/// Largest finite e5m2 value.
inline constexpr float kE5M2Max = 57344.0f;

/// e4m3 byte -> f32 (exact); 0x7F / 0xFF are NaN.
SHARDOPT_HD float e4m3_to_f32(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t mag = b & 0x7Fu;
  if (mag == 0x7Fu) return f32_from_bits(0x7FC00000u | sign);
  return f32_from_bits(sign | f32_bits(detail::decode_magnitude<4, 3>(mag)));
}

/// f32 -> e4m3 byte, round to nearest even, saturating to +-448 (Inf included); NaN -> 0x7F.
SHARDOPT_HD std::uint8_t f32_to_e4m3(float f) {
  const std::uint32_t u = f32_bits(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7Fu;
  std::uint32_t code = a == 0x7F800000u ? 0x7Eu : detail::round_magnitude<4, 3>(a);
  if (code > 0x7Eu) code = 0x7Eu;
  return static_cast<std::uint8_t>(sign | code);
}

// ------------------------------------------------------------------------ e5m2

/// e5m2 byte -> f32 (exact); exponent 31 encodes Inf (mantissa 0) and NaN.
SHARDOPT_HD float e5m2_to_f32(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t mag = b & 0x7Fu;
  if (mag >= 0x7Cu) return f32_from_bits(sign | 0x7F800000u | ((mag & 0x3u) << 21));
  return f32_from_bits(sign | f32_bits(detail::decode_magnitude<5, 2>(mag)));
}

/// f32 -> e5m2 byte, round to nearest even, saturating to +-57344 (Inf included); NaN -> 0x7F.
SHARDOPT_HD std::uint8_t f32_to_e5m2(float f) {
  const std::uint32_t u = f32_bits(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7Fu;
  std::uint32_t code = a == 0x7F800000u ? 0x7Bu : detail::round_magnitude<5, 2>(a);
  if (code > 0x7Bu) code = 0x7Bu;
  return static_cast<std::uint8_t>(sign | code);
}

// ------------------------------------------------------------------------ e8m0

/// e8m0 byte -> f32: 2^(code-127); 0x00 -> 2^-127 (a subnormal f32), 0xFF -> NaN.
SHARDOPT_HD float e8m0_to_f32(std::uint8_t b) {
  if (b == 0xFFu) return f32_from_bits(0x7FC00000u);
  if (b == 0x00u) return f32_from_bits(0x00400000u);
  return f32_from_bits(static_cast<std::uint32_t>(b) << 23);
}

/// f32 -> e8m0 byte: |x| rounded up to a power of two (RCEIL), clamped to
/// [2^-127, 2^127]; Inf -> 0xFE, NaN -> 0xFF, 0 -> 0x00.
SHARDOPT_HD std::uint8_t f32_to_e8m0(float f) {
  const std::uint32_t a = f32_bits(f) & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0xFFu;
  if (a >= 0x7F000000u) return 0xFEu;  // 2^127 and above, Inf included
  std::uint32_t exp = a >> 23;
  const std::uint32_t man = a & 0x7FFFFFu;
  if (exp == 0) return man > 0x400000u ? 0x01u : 0x00u;  // (2^-127, 2^-126) -> 2^-126
  if (man != 0) ++exp;
  return static_cast<std::uint8_t>(exp);
}

// ------------------------------------------------------------------------ generic

/// Encodes f32 into the bit pattern of `t` (zero-extended to 32 bits); u32 and u16 truncate.
SHARDOPT_HD std::uint32_t encode(DType t, float f) {
  switch (t) {
    case DType::f32: return f32_bits(f);
    case DType::bf16: return f32_to_bf16(f);
    case DType::f16: return f32_to_f16(f);
    case DType::e4m3: return f32_to_e4m3(f);
    case DType::e5m2: return f32_to_e5m2(f);
    case DType::e8m0: return f32_to_e8m0(f);
    case DType::u32: return static_cast<std::uint32_t>(f);
    case DType::u16: return static_cast<std::uint16_t>(f);
    case DType::q8_block: return static_cast<std::uint8_t>(f);  // the code itself (its value needs its block's scale)
  }
  return 0;
}

/// Decodes a bit pattern of `t` to f32 (exact for every float type; u32 is converted).
SHARDOPT_HD float decode(DType t, std::uint32_t bits) {
  switch (t) {
    case DType::f32: return f32_from_bits(bits);
    case DType::bf16: return bf16_to_f32(static_cast<std::uint16_t>(bits));
    case DType::f16: return f16_to_f32(static_cast<std::uint16_t>(bits));
    case DType::e4m3: return e4m3_to_f32(static_cast<std::uint8_t>(bits));
    case DType::e5m2: return e5m2_to_f32(static_cast<std::uint8_t>(bits));
    case DType::e8m0: return e8m0_to_f32(static_cast<std::uint8_t>(bits));
    case DType::u32: return static_cast<float>(bits);
    case DType::u16: return static_cast<float>(bits & 0xFFFFu);
    case DType::q8_block: return static_cast<float>(bits & 0xFFu);
  }
  return 0.0f;
}

/// Typed element load/store for the float storage types used by the kernels.
template <DType T> struct Storage;
template <> struct Storage<DType::f32> {
  using type = float;
  SHARDOPT_HD static float load(float v) { return v; }
  SHARDOPT_HD static float store(float f) { return f; }
};
template <> struct Storage<DType::bf16> {
  using type = std::uint16_t;
  SHARDOPT_HD static float load(std::uint16_t v) { return bf16_to_f32(v); }
  SHARDOPT_HD static std::uint16_t store(float f) { return f32_to_bf16(f); }
};
template <> struct Storage<DType::f16> {
  using type = std::uint16_t;
  SHARDOPT_HD static float load(std::uint16_t v) { return f16_to_f32(v); }
  SHARDOPT_HD static std::uint16_t store(float f) { return f32_to_f16(f); }
};

}  // namespace shardopt::num
