// shardopt/dtype.hpp - element types of parameters, gradients and quantized data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardopt {

/// Element type of a buffer or view.
enum class DType : std::uint8_t {
  f32,   ///< IEEE binary32
  bf16,  ///< bfloat16: 8 exponent bits, 7 mantissa bits
  f16,   ///< IEEE binary16
  e4m3,  ///< OCP FP8 E4M3 (no Inf, NaN = S.1111.111, max 448)
  e5m2,  ///< OCP FP8 E5M2 (IEEE-like, max 57344)
  e8m0,  ///< unsigned power-of-two scale: 2^(code-127); 0xFF is NaN, 0x00 decodes to 2^-127
  u32,   ///< 32-bit unsigned integer: flags, counters, ordered bit patterns of amaxes
  u16,   ///< 16-bit unsigned integer: the remainders that complete bf16 parameters to fp32
  /// 8-bit block-quantized Adam moments: one byte per element, a code of a fixed 8-bit
  /// map, and per block of kMomentBlock (256) elements of a parameter one fp32 scale
  /// (AdamOptions::moment_dtype only; docs/state_precision.md).
  q8_block,
};

/// Bytes per element.
constexpr std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::f32:
    case DType::u32: return 4;
    case DType::bf16:
    case DType::f16:
    case DType::u16: return 2;
    case DType::e4m3:
    case DType::e5m2:
    case DType::e8m0:
    case DType::q8_block: return 1;
  }
  return 0;
}

/// Lower-case name ("f32", "bf16", ...).
const char* to_string(DType t) noexcept;

/// Parses a name produced by to_string (also accepts "fp32", "float32", "bfloat16",
/// "fp16", "float16"); throws Error(InvalidArgument) for anything else.
DType parse_dtype(std::string_view name);

/// True for the types a parameter, gradient or moment buffer may hold (f32, bf16, f16).
constexpr bool is_float_storage(DType t) noexcept {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

}  // namespace shardopt
