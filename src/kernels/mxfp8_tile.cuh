// mxfp8_tile.cuh - the tile geometry and device helpers shared by the MXFP8 kernels of
// mxfp8.cu (sharded path) and mxfp8_batch.cu (whole-tensor quantize, one tensor or a
// list of them).
//
// A tile is 32 rows x 128 columns of one member: exactly one columnwise block per
// column and four rowwise blocks per row, so both amaxes come from one read of the
// data. 256 threads. In mxfp8.cu thread t works on row (t/32)*4 + (t%32)/8 of the tile
// and 16 consecutive columns (encode_and_store); mxfp8_batch.cu gives each thread two
// chunks of 8 columns, 64 apart, so that its loads and stores cover full sectors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mxfp8_device.cuh"
#include "kernels/mxfp8_launch.hpp"
#include "kernels/mxfp8_math.cuh"

namespace shardopt::mxfp8::tile {

inline constexpr int kRows = kTileRows;  // 32: one columnwise block
inline constexpr int kCols = kTileCols;  // 128: four rowwise blocks
inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kGroupCols = 16;  // columns per thread
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// Quantizes the thread's 16 columns into both planes and stores columns [lo, hi).
__device__ __forceinline__ void encode_and_store(const std::uint32_t (&w)[8], std::uint8_t row_scale,
                                                 const float (&inv_col)[16], const std::uint32_t (&col_scale)[4],
                                                 std::uint8_t* drow, std::uint8_t* dcol, int lo, int hi) {
  const float inv_row = inverse_scale(row_scale);
  const std::uint32_t row_scales = 0x01010101u * row_scale;
  std::uint32_t qr[4], qc[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    qr[j] = encode_pair(w[2 * j], inv_row, inv_row) | (encode_pair(w[2 * j + 1], inv_row, inv_row) << 16);
    qc[j] = encode_pair(w[2 * j], inv_col[4 * j], inv_col[4 * j + 1]) |
            (encode_pair(w[2 * j + 1], inv_col[4 * j + 2], inv_col[4 * j + 3]) << 16);
    qr[j] = nan_blocks(qr[j], row_scales);
    qc[j] = nan_blocks(qc[j], col_scale[j]);
  }
  if (lo == 0 && hi == kGroupCols && aligned16(drow) && aligned16(dcol)) {
    *reinterpret_cast<uint4*>(drow) = make_uint4(qr[0], qr[1], qr[2], qr[3]);
    *reinterpret_cast<uint4*>(dcol) = make_uint4(qc[0], qc[1], qc[2], qc[3]);
    return;
  }
#pragma unroll
  for (int k = 0; k < kGroupCols; ++k) {
    if (k >= lo && k < hi) {
      drow[k] = static_cast<std::uint8_t>(qr[k / 4] >> (8 * (k % 4)));
      dcol[k] = static_cast<std::uint8_t>(qc[k / 4] >> (8 * (k % 4)));
    }
  }
}

}  // namespace shardopt::mxfp8::tile
