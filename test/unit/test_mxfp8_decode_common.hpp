// test_mxfp8_decode_common.hpp - planes that put every e4m3 code under every e8m0 scale
// byte, for the bf16 decode's host (test/unit) and GPU (test/gpu) tests.
#pragma once

#include <cstdint>
#include <vector>

#include "shardopt/mxfp8.hpp"

namespace mxfp8_decode_test {

/// One plane to decode: its data bytes and scale bytes.
struct Plane {
  std::vector<std::uint8_t> data, scale;
};

/// The shape of all_pairs: 2 members of 256 x 256.
inline shardopt::Mxfp8Shape all_pairs_shape() { return {2, 256, 256}; }

/// Rowwise: row r of member g has scale byte r ^ (g * 0xA5) in all 8 of its blocks and
/// the 256 codes in order. Columnwise: column c's 8 blocks of member g have scale byte
/// c ^ (g * 0x5A), and block b holds codes 32b .. 32b + 31 down its rows. Each member
/// thus holds every (code, scale) pair once.
inline Plane all_pairs(shardopt::Mxfp8Plane plane) {
  const shardopt::Mxfp8Shape s = all_pairs_shape();
  const bool row = plane == shardopt::Mxfp8Plane::Rowwise;
  Plane p;
  p.data.resize(static_cast<std::size_t>(s.numel()));
  p.scale.resize(static_cast<std::size_t>(row ? s.scale_row_numel() : s.scale_col_numel()));
  for (std::int64_t g = 0; g < s.members; ++g)
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t c = 0; c < s.cols; ++c) {
        p.data[static_cast<std::size_t>(s.element_index(g, r, c))] = static_cast<std::uint8_t>(row ? c : r);
        if (row) {
          p.scale[static_cast<std::size_t>(s.scale_row_index(g, r, c))] = static_cast<std::uint8_t>(r ^ (g * 0xA5));
        } else {
          p.scale[static_cast<std::size_t>(s.scale_col_index(g, r, c))] = static_cast<std::uint8_t>(c ^ (g * 0x5A));
        }
      }
  return p;
}

}  // namespace mxfp8_decode_test
