// mxfp8_tile.cuh - the tile geometry and device helpers shared by the MXFP8 kernels of
// mxfp8_batch.cu (whole-tensor quantize, one tensor or a list of them) and
// mxfp8_shard.cu (a rank's ranges).
//
// A tile is 32 rows x 128 columns of one member: exactly one columnwise block per
// column and four rowwise blocks per row, so both amaxes come from one read of the
// data. 256 threads; each holds two chunks of 8 columns of one row, 64 apart, so that
// its loads and stores cover full sectors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mxfp8/mxfp8_device.cuh"
#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "kernels/mxfp8/mxfp8_math.cuh"

namespace shardopt::mxfp8::tile {

inline constexpr int kRows = kTileRows;  // 32: one columnwise block
inline constexpr int kCols = kTileCols;  // 128: four rowwise blocks
inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

// What a thread needs of its part of a tile. Thread (warp w, lane l) works on tile row
// 4w + l/8 and, with q = l % 8, on two chunks of 8 columns: chunk 0 at columns
// [8q, 8q + 8) and chunk 1 at [64 + 8q, 64 + 8q + 8). Each 16-byte load or store of a
// chunk by the 8 lanes of a row covers 128 contiguous bytes (full sectors), and the 4
// lanes q = 0..3 (4..7) of a row hold rowwise blocks 0 and 2 (1 and 3) of the tile.
struct Spot {
  std::int64_t elem;       // flat index of chunk 0's first element (chunk 1: + 64)
  std::int64_t row_scale;  // index of chunk 0's rowwise scale (chunk 1's: + 2)
  std::int64_t col_scale;  // index of the columnwise scale of the tile's first column
  int cols_left;           // columns from the tile's first one to the end of the row
  bool row_ok;             // the thread's row lies inside the member
  bool full;               // the tile takes the unchecked path (block-uniform; set by the kernel)
  // The same thread's part of the next tile along the tile row (`full` aside).
  __device__ void next_column() {
    elem += kCols;
    row_scale += kCols / kBlock;
    col_scale += kCols;
    cols_left -= kCols;
  }
};

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// Amaxes of a tile, part one (every thread of the block calls it). From the thread's 8
// words (bf16 pairs: w[0..3] its chunk 0, w[4..7] its chunk 1) it returns the rowwise
// amax magnitudes of its two chunks' 32-column blocks (chunk 0 low half, chunk 1 high;
// reduced over the 4 lanes of each block, xor 1 and 2) and writes the warp's columnwise
// partial amaxes (its 4 rows, xor 8 and 16; two columns per word) to
// col_partial[warp]. The caller then syncs the block and reduces the warps' partials
// (column_amax_pair).
__device__ __forceinline__ std::uint32_t tile_amaxes(const std::uint32_t (&w)[8],
                                                     std::uint32_t (*col_partial)[kCols / 2]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  std::uint32_t mag[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) mag[k] = w[k] & 0x7FFF7FFFu;
  const std::uint32_t m0 = __vmaxu2(__vmaxu2(mag[0], mag[1]), __vmaxu2(mag[2], mag[3]));
  const std::uint32_t m1 = __vmaxu2(__vmaxu2(mag[4], mag[5]), __vmaxu2(mag[6], mag[7]));
  std::uint32_t row_max = __vmaxu2(__byte_perm(m0, m1, 0x5410), __byte_perm(m0, m1, 0x7632));
  row_max = __vmaxu2(row_max, __shfl_xor_sync(kFullMask, row_max, 1));
  row_max = __vmaxu2(row_max, __shfl_xor_sync(kFullMask, row_max, 2));
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    mag[k] = __vmaxu2(mag[k], __shfl_xor_sync(kFullMask, mag[k], 8));
    mag[k] = __vmaxu2(mag[k], __shfl_xor_sync(kFullMask, mag[k], 16));
  }
  if (lane < 8) {  // column pairs 4q.. (chunk 0) and 32 + 4q.. (chunk 1)
    *reinterpret_cast<uint4*>(&col_partial[warp][4 * lane]) = make_uint4(mag[0], mag[1], mag[2], mag[3]);
    *reinterpret_cast<uint4*>(&col_partial[warp][32 + 4 * lane]) = make_uint4(mag[4], mag[5], mag[6], mag[7]);
  }
  return row_max;
}

// Amaxes of a tile, part two (after the barrier): the columnwise amax magnitudes of tile
// columns 2j (low half) and 2j + 1 (high half) over the 8 warps' partials.
__device__ __forceinline__ std::uint32_t column_amax_pair(const std::uint32_t (*col_partial)[kCols / 2], int j) {
  std::uint32_t v = col_partial[0][j];
#pragma unroll
  for (int k = 1; k < kWarps; ++k) v = __vmaxu2(v, col_partial[k][j]);
  return v;
}

}  // namespace shardopt::mxfp8::tile
