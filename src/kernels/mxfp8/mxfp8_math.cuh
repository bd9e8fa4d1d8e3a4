// mxfp8_math.cuh - the MXFP8 element math shared by the CUDA kernels and their host
// twins (rules in include/shardopt/mxfp8.hpp). Integer code on bit patterns plus one
// IEEE f32 multiply, so both sides produce the same bytes.
#pragma once

#include <cstdint>

#include "shardopt/numerics.hpp"

namespace shardopt::mxfp8 {

inline constexpr int kBlock = 32;
inline constexpr std::uint8_t kScaleNaN = 0xFF;    ///< scale byte of a block with a NaN
inline constexpr std::uint8_t kScaleInf = 0xFE;    ///< scale byte of a block with an Inf (2^127)
inline constexpr std::uint8_t kElementNaN = 0x7F;  ///< every element of a NaN block
inline constexpr std::uint32_t kAmaxNaN = 0x7FC00000u;  ///< exchanged amax of a NaN block

/// |x| of a bf16 as its 15 magnitude bits. Integer order of magnitudes is the order of
/// |x| with Inf (0x7F80) above every finite value and NaN (> 0x7F80) above Inf, so an
/// integer max is a NaN-propagating amax.
SHARDOPT_HD std::uint32_t magnitude(std::uint16_t bf16) { return bf16 & 0x7FFFu; }

/// E8M0 scale byte of a block from its amax magnitude (bf16 bits, sign cleared).
/// amax = M * 2^E with M in [1, 2): the smallest e with 448 * 2^e >= amax is E - 8 when
/// M <= 1.75 (mantissa field <= 0x60) and E - 7 otherwise; byte = e + 127 clamped at
/// 0 (bf16 subnormals and zero land there). Finite amaxes give at most 0xF7.
/// Branch-free (selects): adding 0x1F to the 7 mantissa bits carries into the exponent
/// field exactly when the mantissa exceeds 0x60, so (amax + 0x1F) >> 7 is E + 127 + 1
/// or E + 127 as the rule says.
SHARDOPT_HD std::uint8_t scale_from_magnitude(std::uint32_t amax) {
  const std::uint32_t biased = (amax + 0x1Fu) >> 7;  // e + 127 + 8, for finite amaxes
  const std::uint32_t finite = biased > 8u ? biased - 8u : 0u;
  return static_cast<std::uint8_t>(amax > 0x7F80u ? kScaleNaN : amax == 0x7F80u ? kScaleInf : finite);
}

/// Exchanged u32 amax of a block: the f32 bit pattern of the (bf16-valued) amax, NaN
/// canonical, so that an unsigned max over ranks is the amax of the union.
SHARDOPT_HD std::uint32_t amax_bits(std::uint32_t magnitude_bits) {
  return magnitude_bits > 0x7F80u ? kAmaxNaN : magnitude_bits << 16;
}

/// Scale byte from an exchanged u32 amax.
SHARDOPT_HD std::uint8_t scale_from_amax_bits(std::uint32_t bits) {
  return bits > 0x7F800000u ? kScaleNaN : scale_from_magnitude(bits >> 16);
}

/// The multiplier 2^-e = 2^(127 - byte) of a scale byte: 2^127 for 0x00, 2^-127 (an f32
/// subnormal) for the Inf scale 0xFE, NaN for 0xFF. Branch-free (selects).
SHARDOPT_HD float inverse_scale(std::uint8_t scale) {
  const std::uint32_t finite = (254u - scale) << 23;
  return num::f32_from_bits(scale == kScaleNaN ? kAmaxNaN : scale == kScaleInf ? 0x00400000u : finite);
}

/// One e4m3 element: RNE, saturating, of fl32(x * 2^-e); 0x7F in a NaN block. x is
/// never NaN outside a NaN block.
SHARDOPT_HD std::uint8_t encode_element(std::uint16_t x, std::uint8_t scale) {
  if (scale == kScaleNaN) return kElementNaN;
  return num::f32_to_e4m3(num::bf16_to_f32(x) * inverse_scale(scale));
}

/// bf16 of an fp32 master value (the sharded path quantizes bf16(master)).
SHARDOPT_HD std::uint16_t master_to_bf16(float master) { return num::f32_to_bf16(master); }

/// f32 value of an MXFP8 element: fl32(e4m3 * 2^(scale - 127)).
SHARDOPT_HD float decode_element(std::uint8_t data, std::uint8_t scale) {
  return num::e4m3_to_f32(data) * num::e8m0_to_f32(scale);
}

}  // namespace shardopt::mxfp8
