// nvfp4_units.cuh - the NVFP4 units of work, shared by the CUDA kernels (one thread per
// unit) and the host twins (a loop over the units): the amax of one 16 x 16 block and
// the byte of one element pair, each restricted to a flat element range (the whole
// tensor, or a rank's shard). Both sides call exactly these functions, so they agree
// byte for byte by construction.
#pragma once

#include <cstdint>

#include "kernels/nvfp4/nvfp4_math.cuh"
#include "shardopt/nvfp4.hpp"
#include "shardopt/range.hpp"

namespace shardopt::nvfp4 {

/// Element source of a whole-tensor quantize: bf16 bit patterns, element i at p[i].
struct Bf16Source {
  const std::uint16_t* p;
  SHARDOPT_HD std::uint16_t operator()(std::int64_t i) const { return p[i]; }
};

/// Element source of a shard: fp32 masters, element i at p[i - begin], rounded to bf16.
struct MasterSource {
  const float* p;
  std::int64_t begin;
  SHARDOPT_HD std::uint16_t operator()(std::int64_t i) const { return master_to_bf16(p[i - begin]); }
};

/// Amax bits of block `block` (row-major over the block grid) over its elements whose
/// flat index lies in [lo, hi); 0 when none does.
template <class Source>
SHARDOPT_HD std::uint32_t block_amax(const Nvfp4Shape& s, std::int64_t block, Source src, std::int64_t lo,
                                     std::int64_t hi) {
  const std::int64_t br = block / s.block_cols(), bc = block - br * s.block_cols();
  const std::int64_t r0 = br * kNvfp4Block, r1 = r0 + kNvfp4Block < s.rows ? r0 + kNvfp4Block : s.rows;
  const std::int64_t c0 = bc * kNvfp4Block, c1 = c0 + kNvfp4Block < s.cols ? c0 + kNvfp4Block : s.cols;
  std::uint32_t amax = 0;
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t row = r * s.cols;
    const std::int64_t a = lo - row > c0 ? lo - row : c0;  // the row's columns inside [lo, hi)
    const std::int64_t b = hi - row < c1 ? hi - row : c1;
    for (std::int64_t c = a; c < b; ++c) {
      const std::uint32_t x = amax_bits(src(row + c));
      amax = x > amax ? x : amax;
    }
  }
  return amax;
}

/// Byte k of the data plane: the codes of elements 2k (low nibble) and 2k + 1 (high
/// nibble) that lie in [lo, hi) and inside the tensor, 0 in the other nibbles, from the
/// block scales `scale` and the tensor's S_dec. A refused tensor's byte is 0.
template <class Source>
SHARDOPT_HD std::uint8_t encode_byte(const Nvfp4Shape& s, std::int64_t k, Source src, const std::uint8_t* scale,
                                     float decode, std::int64_t lo, std::int64_t hi) {
  std::uint32_t byte = 0;
  for (int j = 0; j < 2; ++j) {
    const std::int64_t i = 2 * k + j;
    if (i < lo || i >= hi) continue;
    const std::int64_t r = i / s.cols, c = i - r * s.cols;
    const std::uint8_t sc = scale[s.block_index(r, c)];
    if (sc == kScaleRefused) continue;
    byte |= static_cast<std::uint32_t>(encode_element(src(i), element_multiplier(sc, decode))) << (4 * j);
  }
  return static_cast<std::uint8_t>(byte);
}

/// The blocks of every block row that holds an element of `range` (empty for an empty
/// range): the blocks a rank's partial amax writes. Host code (launch arguments).
inline Range touched_blocks(const Nvfp4Shape& s, Range range) {
  if (range.size() == 0) return {0, 0};
  const std::int64_t first_row = range.begin / s.cols / kNvfp4Block;
  const std::int64_t last_row = (range.end - 1) / s.cols / kNvfp4Block;
  return {first_row * s.block_cols(), (last_row + 1) * s.block_cols()};
}

/// f32 value of element i of the data plane (its nibble of byte i / 2).
SHARDOPT_HD float decode_at(const Nvfp4Shape& s, std::int64_t i, const std::uint8_t* data,
                            const std::uint8_t* scale, float decode) {
  const std::int64_t r = i / s.cols, c = i - r * s.cols;
  const auto code = static_cast<std::uint8_t>(data[i / 2] >> (4 * (i % 2)));
  return decode_element(code, scale[s.block_index(r, c)], decode);
}

}  // namespace shardopt::nvfp4
