// nvfp4_math.cuh - the NVFP4 element math shared by the CUDA kernels and their host
// twins (rules in docs/nvfp4.md). Integer code on bit patterns plus a few IEEE f32
// multiplies and divisions, each rounded once to nearest even on both sides (the
// device path names the rounding with __fmul_rn / __fdiv_rn; -fmad=false keeps the
// compiler from fusing), so both produce the same bytes.
#pragma once

#include <cstdint>

#include "shardopt/numerics.hpp"

namespace shardopt::nvfp4 {

inline constexpr std::uint32_t kAmaxNonFinite = 0x7FC00000u;  ///< amax bits of a NaN / Inf element
inline constexpr std::uint8_t kScaleRefused = 0x7F;  ///< scale byte (E4M3 NaN) of a refused tensor
inline constexpr float kF32Max = 3.40282347e+38f;   ///< FLT_MAX
inline constexpr float kEncodeNumerator = 2688.0f;  ///< 448 (E4M3 max) * 6 (E2M1 max)
inline constexpr float kInvE2m1Max = 1.0f / 6.0f;    ///< fl32(1/6)

/// fl32(a * b), fl32(a + b) and fl32(a / b), rounded to nearest even on the host and the
/// device.
SHARDOPT_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SHARDOPT_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SHARDOPT_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// Exchanged amax of one bf16 element: the f32 bits of |x|, kAmaxNonFinite for NaN and
/// +-Inf. Non-negative f32 bits order as unsigned integers, so an integer max is the amax.
SHARDOPT_HD std::uint32_t amax_bits(std::uint16_t bf16) {
  const std::uint32_t magnitude = bf16 & 0x7FFFu;
  return magnitude >= 0x7F80u ? kAmaxNonFinite : magnitude << 16;
}

/// True when a tensor's amax bits refuse it (a NaN or Inf element somewhere).
SHARDOPT_HD bool refused(std::uint32_t tensor_amax) { return tensor_amax >= 0x7F800000u; }

/// S_enc = min(fl32(2688 / amax), FLT_MAX), 1 when amax is 0 or S_enc is 0.
/// The zero amax is tested before the division, not after the clamp: g++ 13.3 at -O2
/// folded "quotient > FLT_MAX" into "amax == 0" in that order and returned 1 where
/// the quotient overflows (seen in the test oracle, docs/decisions.md).
SHARDOPT_HD float encode_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float s = div_rn(kEncodeNumerator, amax);
  if (s == 0.0f) return 1.0f;
  return s < kF32Max ? s : kF32Max;
}

/// The tensor's two stored fp32 values from its amax bits: amax (NaN if refused) and
/// S_dec = fl32(1 / S_enc) (NaN if refused).
struct GlobalScale {
  float amax;
  float encode;  ///< S_enc
  float decode;  ///< S_dec
};
SHARDOPT_HD GlobalScale global_scale(std::uint32_t tensor_amax) {
  if (refused(tensor_amax)) {
    const float nan = num::f32_from_bits(kAmaxNonFinite);
    return {nan, nan, nan};
  }
  const float amax = num::f32_from_bits(tensor_amax);
  const float enc = encode_scale(amax);
  return {amax, enc, div_rn(1.0f, enc)};
}

/// fl32(S_enc * fl32(1/6)): the factor of every block scale of a tensor that is not
/// refused (kernels compute it once per tensor).
SHARDOPT_HD float block_factor(std::uint32_t tensor_amax) {
  return mul_rn(encode_scale(num::f32_from_bits(tensor_amax)), kInvE2m1Max);
}

/// E4M3 decode scale of a block of a tensor that is not refused, from its block_factor:
/// RNE saturating e4m3 of fl32(block_amax * factor).
SHARDOPT_HD std::uint8_t block_scale_of(std::uint32_t block_amax, float factor) {
  return num::f32_to_e4m3(mul_rn(num::f32_from_bits(block_amax), factor));
}

/// E4M3 decode scale of a block: RNE saturating e4m3 of fl32(block_amax * fl32(S_enc *
/// fl32(1/6))); kScaleRefused for a refused tensor.
SHARDOPT_HD std::uint8_t block_scale(std::uint32_t block_amax, std::uint32_t tensor_amax) {
  if (refused(tensor_amax)) return kScaleRefused;
  return block_scale_of(block_amax, block_factor(tensor_amax));
}

/// The multiplier of a block's elements: min(fl32(1 / fl32(e4m3(scale) * S_dec)), FLT_MAX).
/// A zero scale gives FLT_MAX (1 / 0 is Inf, clamped).
SHARDOPT_HD float element_multiplier(std::uint8_t scale, float decode) {
  const float r = div_rn(1.0f, mul_rn(num::e4m3_to_f32(scale), decode));
  return r < kF32Max ? r : kF32Max;
}

/// E2M1 code of an f32 that is not NaN, as a u32 (the kernels' per-element conversion,
/// through encode_nibble): RNE on the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating to 6
/// (Inf included); sign << 3 | index, the sign kept when the magnitude rounds to 0.
/// In a few integer operations and one f32 addition, because it runs once per element:
/// the magnitude m = |f| clamped to 6 lies in one of three binades of even spacing on
/// the grid: [0, 2) step 0.5 (codes 0-4), [2, 4) step 1 (codes 4-6), [4, 6] step 2
/// (codes 6-7). With e the exponent field of m raised to at least 127 (so e is 127, 128
/// or 129), the magic number M = 2^(22 + e - 127) has an f32 spacing equal to the step,
/// so fl32(m + M) rounds m to the grid, ties to even (the even multiple of the step, i.e.
/// the even E2M1 mantissa), and its bits minus M's are the rounded m in steps; the code
/// is those steps plus 2 * (e - 127) (steps 0-4, 2-4 and 2-3 in the three binades give
/// codes 0-4, 4-6 and 6-7). (m = 0.25 -> 0, 0.75 -> 2, 1.75 -> 4, 2.5 -> 4, 3.5 -> 6, 5 -> 6,
/// 6 -> 7.) The addition is exact before its one rounding and insensitive to FTZ / DAZ (a
/// subnormal m gives M itself either way). The same codes as the generic
/// num::detail::round_magnitude<2, 1> plus saturation for every non-NaN f32 (all 2^32
/// patterns checked once on 2026-11-26; test_nvfp4's E2m1EqualsGenericRounding keeps
/// checking every pattern within 2^13 of each place where the code changes, and every
/// 61st pattern).
SHARDOPT_HD std::uint32_t e2m1_of_number(float f) {
  const std::uint32_t u = num::f32_bits(f);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const std::uint32_t m = a < 0x40C00000u ? a : 0x40C00000u;  // |f| clamped to 6
  const std::uint32_t e = (m >> 23) < 127u ? 127u : (m >> 23);  // 127, 128 or 129
  const std::uint32_t magic = (e << 23) - (127u << 23) + 0x4A800000u;  // 2^(22 + e - 127)
  const std::uint32_t sum = num::f32_bits(add_rn(num::f32_from_bits(m), num::f32_from_bits(magic)));
  return ((u >> 28) & 0x8u) | (sum - magic + 2 * (e - 127u));
}

/// E2M1 code of an f32 (e2m1_of_number); 0 for NaN, which the library never encodes (a
/// tensor holding one is refused).
SHARDOPT_HD std::uint8_t f32_to_e2m1(float f) {
  if ((num::f32_bits(f) & 0x7FFFFFFFu) > 0x7F800000u) return 0;
  return static_cast<std::uint8_t>(e2m1_of_number(f));
}

/// f32 value of an E2M1 code (exact).
SHARDOPT_HD float e2m1_to_f32(std::uint8_t code) {
  const float magnitude = num::detail::decode_magnitude<2, 1>(code & 0x7u);
  return (code & 0x8u) ? -magnitude : magnitude;
}

/// One element's code, e2m1(fl32(x * multiplier)), from the element's f32 value x (a
/// bf16 value) and its block's multiplier, as a u32. x is finite and the multiplier
/// finite and positive (a refused tensor's elements are never encoded), so the product
/// is never NaN.
SHARDOPT_HD std::uint32_t encode_nibble(float x, float multiplier) { return e2m1_of_number(mul_rn(x, multiplier)); }

/// One element's code: e2m1(fl32(x * multiplier)).
SHARDOPT_HD std::uint8_t encode_element(std::uint16_t bf16, float multiplier) {
  return static_cast<std::uint8_t>(encode_nibble(num::bf16_to_f32(bf16), multiplier));
}

/// f32 value of an element: fl32(e2m1 * fl32(e4m3(scale) * S_dec)); a refused tensor's
/// elements (NaN scale and S_dec) give the one quiet NaN 0x7FC00000 on both sides (the
/// host's SSE keeps an operand's NaN payload and sign, the GPU returns its own NaN).
SHARDOPT_HD float decode_element(std::uint8_t code, std::uint8_t scale, float decode) {
  const float v = mul_rn(e2m1_to_f32(code), mul_rn(num::e4m3_to_f32(scale), decode));
  return v == v ? v : num::f32_from_bits(kAmaxNonFinite);
}

/// bf16 of an fp32 master value (the sharded path quantizes bf16(master)).
SHARDOPT_HD std::uint16_t master_to_bf16(float master) { return num::f32_to_bf16(master); }

}  // namespace shardopt::nvfp4
