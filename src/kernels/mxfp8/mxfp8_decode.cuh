// mxfp8_decode.cuh - one element of the bf16-output MXFP8 decode, shared by the CUDA
// kernel (mxfp8_decode.cu) and its host twin (mxfp8_decode.cpp).
#pragma once

#include <cstdint>

#include "kernels/mxfp8/mxfp8_math.cuh"
#include "shardopt/numerics.hpp"

namespace shardopt::mxfp8 {

/// The one NaN the bf16 decode writes (the f32 decode's NaN differs between the host,
/// which keeps an operand's payload, and the GPU, which returns 0x7FFFFFFF).
inline constexpr std::uint16_t kBf16NaN = 0x7FC0u;

/// bf16 (round to nearest even) of the f32 decode fl32(e4m3 * 2^(scale - 127)); a NaN
/// element (0x7F / 0xFF) or a NaN block (scale 0xFF) gives kBf16NaN.
SHARDOPT_HD std::uint16_t decode_element_bf16(std::uint8_t data, std::uint8_t scale) {
  const float v = decode_element(data, scale);
  return v != v ? kBf16NaN : num::f32_to_bf16(v);
}

/// Where the scale of flat element e of one plane sits, for a tensor of contiguous
/// members of [rows, cols] (Mxfp8Shape's scale_row_index / scale_col_index from e).
struct PlaneIndex {
  std::int64_t rows = 0, cols = 0;
  bool rowwise = true;

  SHARDOPT_HD std::int64_t scale_of(std::int64_t e) const {
    const std::int64_t row = e / cols, c = e - row * cols;  // row counted across members
    if (rowwise) return row * ((cols + kBlock - 1) / kBlock) + c / kBlock;
    const std::int64_t g = row / rows, r = row - g * rows;
    return (g * ((rows + kBlock - 1) / kBlock) + r / kBlock) * cols + c;
  }
};

}  // namespace shardopt::mxfp8
