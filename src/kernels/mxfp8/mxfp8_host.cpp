// mxfp8_host.cpp - host twins of the MXFP8 kernels: the same element math
// (mxfp8_math.cuh), written as plain loops over blocks.
#include <algorithm>
#include <cstring>

#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "kernels/mxfp8/mxfp8_math.cuh"

namespace shardopt::mxfp8 {
namespace {

// Columns processed together by the columnwise passes (a stack array of amaxes).
constexpr std::int64_t kColumnChunk = 512;

Mxfp8Member member_of(const Mxfp8Shape& s, const Mxfp8Member* table, std::int64_t g) {
  if (table != nullptr) return table[g];
  return Mxfp8Member{g * s.member_numel(), g * s.rows * s.row_blocks(), g * s.col_blocks() * s.cols};
}

// Calls fn(g, r, c_begin, c_end, i) for each row piece of `range` (i: flat index of
// element (g, r, c_begin)).
template <class Fn>
void for_each_row_piece(const Mxfp8Shape& s, Range range, Fn&& fn) {
  std::int64_t i = range.begin;
  while (i < range.end) {
    const std::int64_t global_row = i / s.cols;
    const std::int64_t c = i - global_row * s.cols;
    const std::int64_t c_end = std::min(s.cols, c + (range.end - i));
    fn(global_row / s.rows, global_row % s.rows, c, c_end, i);
    i += c_end - c;
  }
}

}  // namespace

void host_quantize(const Mxfp8Shape& s, const std::uint16_t* src, const Mxfp8Planes& out,
                   const Mxfp8Member* table) {
  const std::int64_t rb = s.row_blocks();
  for (std::int64_t g = 0; g < s.members; ++g) {
    const Mxfp8Member m = member_of(s, table, g);
    const std::uint16_t* x = src + m.element_offset;
    std::uint8_t* drow = out.data_row + m.element_offset;
    std::uint8_t* dcol = out.data_col + m.element_offset;
    // Rowwise: 32 consecutive elements of a row.
    for (std::int64_t r = 0; r < s.rows; ++r) {
      for (std::int64_t b = 0; b < rb; ++b) {
        const std::int64_t c0 = b * kBlock, c1 = std::min(s.cols, c0 + kBlock);
        std::uint32_t amax = 0;
        for (std::int64_t c = c0; c < c1; ++c) amax = std::max(amax, magnitude(x[r * s.cols + c]));
        const std::uint8_t scale = scale_from_magnitude(amax);
        out.scale_row[m.scale_row_offset + r * rb + b] = scale;
        for (std::int64_t c = c0; c < c1; ++c) drow[r * s.cols + c] = encode_element(x[r * s.cols + c], scale);
      }
    }
    // Columnwise: 32 consecutive rows of a column, a chunk of columns at a time.
    for (std::int64_t b = 0; b < s.col_blocks(); ++b) {
      const std::int64_t r0 = b * kBlock, r1 = std::min(s.rows, r0 + kBlock);
      for (std::int64_t cc = 0; cc < s.cols; cc += kColumnChunk) {
        const std::int64_t n = std::min(kColumnChunk, s.cols - cc);
        std::uint32_t amax[kColumnChunk] = {};
        for (std::int64_t r = r0; r < r1; ++r)
          for (std::int64_t j = 0; j < n; ++j) amax[j] = std::max(amax[j], magnitude(x[r * s.cols + cc + j]));
        std::uint8_t scale[kColumnChunk];
        for (std::int64_t j = 0; j < n; ++j) {
          scale[j] = scale_from_magnitude(amax[j]);
          out.scale_col[m.scale_col_offset + b * s.cols + cc + j] = scale[j];
        }
        for (std::int64_t r = r0; r < r1; ++r)
          for (std::int64_t j = 0; j < n; ++j)
            dcol[r * s.cols + cc + j] = encode_element(x[r * s.cols + cc + j], scale[j]);
      }
    }
  }
}

void host_quantize_batch(const BatchEntry* entries, int count) {
  for (int i = 0; i < count; ++i) host_quantize(entries[i].shape, entries[i].src, entries[i].out, entries[i].members);
}

void host_partial_scales(const Mxfp8Shape& s, Range range, const float* master, std::uint8_t* scale_row,
                         std::uint8_t* scale_col) {
  std::memset(scale_row, 0, static_cast<std::size_t>(s.scale_row_numel()));
  std::memset(scale_col, 0, static_cast<std::size_t>(s.scale_col_numel()));
  // The scale byte is monotone in the amax, so the max of the elements' bytes is the
  // byte of the block's (partial) amax.
  for_each_row_piece(s, range, [&](std::int64_t g, std::int64_t r, std::int64_t c0, std::int64_t c1, std::int64_t i) {
    const float* x = master + (i - range.begin) - c0;
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::uint8_t b = scale_from_magnitude(magnitude(master_to_bf16(x[c])));
      std::uint8_t& sr = scale_row[s.scale_row_index(g, r, c)];
      std::uint8_t& sc = scale_col[s.scale_col_index(g, r, c)];
      sr = std::max(sr, b);
      sc = std::max(sc, b);
    }
  });
}

void host_partial_amax(const Mxfp8Shape& s, Range range, const float* master, std::uint32_t* amax_row,
                       std::uint32_t* amax_col) {
  std::memset(amax_row, 0, static_cast<std::size_t>(s.scale_row_numel()) * sizeof(std::uint32_t));
  std::memset(amax_col, 0, static_cast<std::size_t>(s.scale_col_numel()) * sizeof(std::uint32_t));
  for_each_row_piece(s, range, [&](std::int64_t g, std::int64_t r, std::int64_t c0, std::int64_t c1, std::int64_t i) {
    const float* x = master + (i - range.begin) - c0;
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::uint32_t a = amax_bits(magnitude(master_to_bf16(x[c])));
      std::uint32_t& ar = amax_row[s.scale_row_index(g, r, c)];
      std::uint32_t& ac = amax_col[s.scale_col_index(g, r, c)];
      ar = std::max(ar, a);
      ac = std::max(ac, a);
    }
  });
}

void host_scales_from_amax(const Mxfp8Shape& s, const std::uint32_t* amax_row, const std::uint32_t* amax_col,
                           std::uint8_t* scale_row, std::uint8_t* scale_col) {
  for (std::int64_t k = 0; k < s.scale_row_numel(); ++k) scale_row[k] = scale_from_amax_bits(amax_row[k]);
  for (std::int64_t k = 0; k < s.scale_col_numel(); ++k) scale_col[k] = scale_from_amax_bits(amax_col[k]);
}

void host_shard_data(const Mxfp8Shape& s, Range range, const float* master, const std::uint8_t* scale_row,
                     const std::uint8_t* scale_col, std::uint8_t* data_row, std::uint8_t* data_col) {
  for_each_row_piece(s, range, [&](std::int64_t g, std::int64_t r, std::int64_t c0, std::int64_t c1, std::int64_t i) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t e = i + (c - c0);
      const std::uint16_t x = master_to_bf16(master[e - range.begin]);
      data_row[e] = encode_element(x, scale_row[s.scale_row_index(g, r, c)]);
      data_col[e] = encode_element(x, scale_col[s.scale_col_index(g, r, c)]);
    }
  });
}

void host_partial_scales_batch(const ShardEntry* entries, int count) {
  for (int k = 0; k < count; ++k) {
    const ShardEntry& e = entries[k];
    host_partial_scales(e.shape, e.range, e.master, e.out.scale_row, e.out.scale_col);
  }
}

void host_shard_data_batch(const ShardEntry* entries, int count) {
  for (int k = 0; k < count; ++k) {
    const ShardEntry& e = entries[k];
    host_shard_data(e.shape, e.range, e.master, e.out.scale_row, e.out.scale_col, e.out.data_row, e.out.data_col);
  }
}

void host_owned_batch(const ShardEntry* entries, int count) {
  for (int k = 0; k < count; ++k) {
    const ShardEntry& e = entries[k];
    host_partial_scales(e.shape, e.range, e.master, e.out.scale_row, e.out.scale_col);
    if (e.owned_end > e.owned_begin)
      host_shard_data(e.shape, Range{e.owned_begin, e.owned_end}, e.master + (e.owned_begin - e.range.begin),
                      e.out.scale_row, e.out.scale_col, e.out.data_row, e.out.data_col);
  }
}

void host_rest_batch(const ShardEntry* rest, int count) {
  for (int k = 0; k < count; ++k) {
    const ShardEntry& e = rest[k];
    const std::int64_t rows = e.shape.rows, cols = e.shape.cols, gtr = e.first_tile_row;
    const std::int64_t member = gtr / e.row_tiles, row0 = gtr % e.row_tiles * kTileRows;
    const std::int64_t first = (member * rows + row0) * cols;
    const std::int64_t end = (member * rows + std::min(rows, row0 + kTileRows)) * cols;
    const Range piece{std::max(first, e.range.begin), std::min(end, e.range.end)};
    if (piece.size() <= 0) continue;
    host_shard_data(e.shape, piece, e.master + (piece.begin - e.range.begin), e.out.scale_row, e.out.scale_col,
                    e.out.data_row, e.out.data_col);
  }
}

void host_dequantize(const Mxfp8Shape& s, Mxfp8Plane plane, const std::uint8_t* data, const std::uint8_t* scale,
                     float* out) {
  for (std::int64_t g = 0; g < s.members; ++g)
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t c = 0; c < s.cols; ++c) {
        const std::int64_t e = s.element_index(g, r, c);
        const std::int64_t k = plane == Mxfp8Plane::Rowwise ? s.scale_row_index(g, r, c) : s.scale_col_index(g, r, c);
        out[e] = decode_element(data[e], scale[k]);
      }
}

}  // namespace shardopt::mxfp8
