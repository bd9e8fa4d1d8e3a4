// test_mxfp8_decode_common.hpp - planes that put every e4m3 code under every e8m0 scale
// byte, random planes, and a batched decode (dequantize_mxfp8_batch) on either backend
// into guarded outputs, for the bf16 decode's host (test/unit) and GPU (test/gpu) tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/memory.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_common.hpp"

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

/// Random bytes, scales mostly in a normal range with 0x00, 0xFE and 0xFF mixed in.
inline Plane random_plane(const shardopt::Mxfp8Shape& s, shardopt::Mxfp8Plane plane, unsigned seed) {
  std::mt19937 rng(seed);
  Plane p;
  p.data.resize(static_cast<std::size_t>(s.numel()));
  p.scale.resize(
      static_cast<std::size_t>(plane == shardopt::Mxfp8Plane::Rowwise ? s.scale_row_numel() : s.scale_col_numel()));
  for (auto& b : p.data) b = static_cast<std::uint8_t>(rng());
  for (auto& b : p.scale) {
    const unsigned k = rng() % 64;
    b = static_cast<std::uint8_t>(k == 0 ? 0x00 : k == 1 ? 0xFE : k == 2 ? 0xFF : 0x60 + rng() % 64);
  }
  return p;
}

/// One tensor of a batched decode test: the plane, and how far (bytes; output:
/// elements) its data and output pointers sit past the start of their buffers.
struct BatchCase {
  shardopt::Mxfp8Shape shape;
  shardopt::Mxfp8Plane plane = shardopt::Mxfp8Plane::Rowwise;
  Plane bytes;
  int data_off = 0, out_off = 0;
};

/// Poisoned output elements around each output (and the poison).
inline constexpr std::size_t kGuard = 8;
inline constexpr std::uint16_t kPoison16 = 0xDEAD;

/// dequantize_mxfp8_batch of `cases` on backend b (each tensor in buffers of its own,
/// outputs poisoned with out_off + kGuard elements before and kGuard after), then each
/// output buffer whole.
inline std::vector<std::vector<std::uint16_t>> batch_decode(shardopt::Backend b, const std::vector<BatchCase>& cases) {
  using namespace shardopt;
  std::vector<DeviceBuffer> data, scale, out;
  std::vector<Mxfp8Decode> list;
  for (const BatchCase& c : cases) {
    std::vector<std::uint8_t> d(static_cast<std::size_t>(c.data_off), 0xA5);
    d.insert(d.end(), c.bytes.data.begin(), c.bytes.data.end());
    data.push_back(mxfp8_test::upload(b, d));
    scale.push_back(mxfp8_test::upload(b, c.bytes.scale));
    out.push_back(mxfp8_test::upload(
        b, std::vector<std::uint16_t>(c.bytes.data.size() + static_cast<std::size_t>(c.out_off) + 2 * kGuard, kPoison16)));
    list.push_back({c.shape, c.plane, data.back().as<std::uint8_t>() + c.data_off, scale.back().as<std::uint8_t>(),
                    out.back().as<std::uint16_t>() + kGuard + c.out_off});
  }
  dequantize_mxfp8_batch(list, b, nullptr);
  std::vector<std::vector<std::uint16_t>> got;
  for (std::size_t t = 0; t < cases.size(); ++t)
    got.push_back(mxfp8_test::download<std::uint16_t>(
        b, out[t], cases[t].bytes.data.size() + static_cast<std::size_t>(cases[t].out_off) + 2 * kGuard));
  return got;
}

/// What case c's output buffer must hold when it decodes to `values`.
inline std::vector<std::uint16_t> guarded(const BatchCase& c, const std::vector<std::uint16_t>& values) {
  std::vector<std::uint16_t> want(static_cast<std::size_t>(c.out_off) + kGuard, kPoison16);
  want.insert(want.end(), values.begin(), values.end());
  want.insert(want.end(), kGuard, kPoison16);
  return want;
}

/// Cases for the batch: every code under every scale in both planes (8-wide path),
/// random planes with partial blocks, odd widths (element path), a misaligned data or
/// output pointer, grouped members, and `tiny` more one-to-four-row tensors.
inline std::vector<BatchCase> batch_cases(int tiny) {
  using shardopt::Mxfp8Plane;
  using shardopt::Mxfp8Shape;
  std::vector<BatchCase> cases;
  for (Mxfp8Plane plane : {Mxfp8Plane::Rowwise, Mxfp8Plane::Columnwise})
    cases.push_back({all_pairs_shape(), plane, all_pairs(plane)});
  unsigned seed = 100;
  const std::vector<Mxfp8Shape> shapes{{3, 45, 70}, {1, 33, 8}, {2, 64, 96}, {1, 1, 1}, {4, 96, 256}, {2, 64, 100}};
  for (std::size_t i = 0; i < shapes.size(); ++i)
    for (Mxfp8Plane plane : {Mxfp8Plane::Rowwise, Mxfp8Plane::Columnwise})
      cases.push_back({shapes[i], plane, random_plane(shapes[i], plane, seed++), static_cast<int>(i % 2),
                       static_cast<int>(i % 3 == 2 ? 4 : 0)});
  for (int k = 0; k < tiny; ++k) {
    const Mxfp8Shape s{1, 1 + k % 4, 8 * (1 + k % 3)};
    const Mxfp8Plane plane = k % 2 == 0 ? Mxfp8Plane::Rowwise : Mxfp8Plane::Columnwise;
    cases.push_back({s, plane, random_plane(s, plane, seed++)});
  }
  return cases;
}

}  // namespace mxfp8_decode_test
