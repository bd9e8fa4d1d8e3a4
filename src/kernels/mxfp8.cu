// mxfp8.cu - the kernels of the sharded MXFP8 path, and dequantize. (The whole-tensor
// quantize, of one tensor or a list of them, is in mxfp8_batch.cu.)
//
// Tiles of 32 x 128 elements (mxfp8_tile.cuh). Rowwise amax: the thread's 16 columns,
// then the neighbour lane (xor 1). Columnwise amax: the warp's 4 rows by shuffles
// (xor 8, 16), the 8 warps through shared memory. Amaxes are integer maxima of bf16
// magnitudes (two per word with __vmaxu2), which propagates NaN above Inf above finite
// values. PartialScales / PartialAmax compute the amaxes of the elements inside the
// rank's range (others count as zero), ShardData quantizes the elements of the range
// with the combined scales.
//
// Element conversion: fl32(x * 2^-e) (an IEEE multiply, as in the host twin) and the
// hardware's round-to-nearest-even saturating f32x2 -> e4m3x2 conversion
// (mxfp8_device.cuh), which gives the bytes of the host twin's num::f32_to_e4m3 (checked
// for every bf16 value and every scale byte in test/gpu/test_mxfp8_convert.cu). NaN
// blocks are then forced to 0x7F.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/check.hpp"
#include "kernels/mxfp8_launch.hpp"
#include "kernels/mxfp8_math.cuh"
#include "kernels/mxfp8_tile.cuh"

namespace shardopt::mxfp8 {
namespace {

using tile::aligned16;
using tile::encode_and_store;
using tile::kFullMask;
using tile::kGroupCols;
using tile::kThreads;
using tile::kWarps;

enum class Mode {
  PartialScales,  // scale bytes of the range's partial amaxes
  PartialAmax,    // u32 amaxes of the range's partial amaxes
  ShardData,      // data bytes of the range from combined scales
};

struct TileArgs {
  std::int64_t rows = 0, cols = 0;
  std::int64_t row_tiles = 0, col_tiles = 0;    // tiles per member
  std::int64_t row_blocks = 0, col_blocks = 0;  // Mxfp8Shape::row_blocks / col_blocks
  std::int64_t first_tile = 0;                  // tile of blockIdx.x == 0
  const float* master = nullptr;                // element i at master[i - begin]
  std::int64_t begin = 0, end = 0;              // the rank's element range
  std::uint8_t* data_row = nullptr;
  std::uint8_t* data_col = nullptr;
  std::uint8_t* scale_row = nullptr;            // written by PartialScales
  std::uint8_t* scale_col = nullptr;
  const std::uint8_t* in_scale_row = nullptr;   // read by ShardData
  const std::uint8_t* in_scale_col = nullptr;
  std::uint32_t* amax_row = nullptr;            // written by PartialAmax
  std::uint32_t* amax_col = nullptr;
};

template <Mode M>
__global__ void __launch_bounds__(kThreads) tile_kernel(const TileArgs a) {
  __shared__ __align__(16) std::uint32_t col_partial[kWarps][kTileCols / 2];

  // Which tile, which member (tile counts fit in 32 bits: checked at launch).
  const std::uint32_t tile = static_cast<std::uint32_t>(a.first_tile) + blockIdx.x;
  const std::uint32_t per_member = static_cast<std::uint32_t>(a.row_tiles * a.col_tiles);
  const std::uint32_t col_tiles = static_cast<std::uint32_t>(a.col_tiles);
  const std::uint32_t g32 = tile / per_member;
  const std::uint32_t in_member = tile - g32 * per_member;
  const std::uint32_t rt32 = in_member / col_tiles;
  const std::int64_t g = g32, rt = rt32, ct = in_member - rt32 * col_tiles;

  const std::int64_t elem_base = g * a.rows * a.cols;
  const std::int64_t srow_base = g * a.rows * a.row_blocks;
  const std::int64_t scol_base = g * a.col_blocks * a.cols;

  // This thread's row and 16 columns; valid columns [lo, hi) of the 16.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane & 7;
  const std::int64_t r = rt * kTileRows + warp * 4 + (lane >> 3);
  const std::int64_t c0 = ct * kTileCols + group * kGroupCols;
  const std::int64_t i0 = elem_base + r * a.cols + c0;
  const bool in_tensor = r < a.rows && c0 < a.cols;
  int lo = 0, hi = 0;
  if (in_tensor) {
    std::int64_t h = std::min<std::int64_t>(kGroupCols, a.cols - c0);
    const std::int64_t l = std::clamp<std::int64_t>(a.begin - i0, 0, kGroupCols);
    h = std::min(h, std::clamp<std::int64_t>(a.end - i0, 0, kGroupCols));
    lo = static_cast<int>(l);
    h = std::max(h, l);
    hi = static_cast<int>(h);
  }
  const bool full = lo == 0 && hi == kGroupCols;

  // Load the 16 values as bf16(master) pairs (zero where not valid).
  std::uint32_t w[8];
  {
    const float* p = a.master + (i0 - a.begin);
    float f[16];
    if (full && aligned16(p)) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(p) + q);
        f[4 * q] = v.x; f[4 * q + 1] = v.y; f[4 * q + 2] = v.z; f[4 * q + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kGroupCols; ++k) f[k] = (k >= lo && k < hi) ? p[k] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k)
      w[k] = static_cast<std::uint32_t>(master_to_bf16(f[2 * k])) |
             (static_cast<std::uint32_t>(master_to_bf16(f[2 * k + 1])) << 16);
  }

  if constexpr (M == Mode::ShardData) {
    if (hi <= lo) return;  // no barrier in this mode
    const std::uint8_t row_scale = a.in_scale_row[srow_base + r * a.row_blocks + c0 / kBlock];
    const std::uint8_t* sc = a.in_scale_col + scol_base + rt * a.cols + c0;
    std::uint32_t cs[4] = {0u, 0u, 0u, 0u};
    if (hi - lo == kGroupCols && aligned16(sc)) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(sc));
      cs[0] = v.x; cs[1] = v.y; cs[2] = v.z; cs[3] = v.w;
    } else {
#pragma unroll
      for (int k = 0; k < kGroupCols; ++k)
        if (k >= lo && k < hi) cs[k / 4] |= static_cast<std::uint32_t>(sc[k]) << (8 * (k % 4));
    }
    float inv[16];
#pragma unroll
    for (int k = 0; k < kGroupCols; ++k) inv[k] = inverse_scale(static_cast<std::uint8_t>(cs[k / 4] >> (8 * (k % 4))));
    encode_and_store(w, row_scale, inv, cs, a.data_row + i0, a.data_col + i0, lo, hi);
    return;
  } else {
    // Rowwise amax of the 32-column block shared with the neighbour lane.
    std::uint32_t mag[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) mag[k] = w[k] & 0x7FFF7FFFu;
    std::uint32_t row_max = mag[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) row_max = __vmaxu2(row_max, mag[k]);
    row_max = max(row_max & 0xFFFFu, row_max >> 16);
    row_max = max(row_max, __shfl_xor_sync(kFullMask, row_max, 1));

    // Columnwise amax: the warp's 4 rows, then the 8 warps.
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      mag[k] = __vmaxu2(mag[k], __shfl_xor_sync(kFullMask, mag[k], 8));
      mag[k] = __vmaxu2(mag[k], __shfl_xor_sync(kFullMask, mag[k], 16));
    }
    if (lane < 8) {
      uint4* dst = reinterpret_cast<uint4*>(&col_partial[warp][lane * 8]);
      dst[0] = make_uint4(mag[0], mag[1], mag[2], mag[3]);
      dst[1] = make_uint4(mag[4], mag[5], mag[6], mag[7]);
    }
    __syncthreads();
    if (threadIdx.x < kTileCols / 2) {
      const int j = threadIdx.x;  // tile columns 2j and 2j + 1
      std::uint32_t v = col_partial[0][j];
#pragma unroll
      for (int q = 1; q < kWarps; ++q) v = __vmaxu2(v, col_partial[q][j]);
      const std::uint32_t amax_lo = v & 0xFFFFu, amax_hi = v >> 16;
      const std::int64_t c = ct * kTileCols + 2 * j;
      const std::int64_t k = scol_base + rt * a.cols + c;
      if constexpr (M == Mode::PartialAmax) {
        if (c < a.cols) a.amax_col[k] = amax_bits(amax_lo);
        if (c + 1 < a.cols) a.amax_col[k + 1] = amax_bits(amax_hi);
      } else {
        const std::uint8_t s_lo = scale_from_magnitude(amax_lo), s_hi = scale_from_magnitude(amax_hi);
        if (c < a.cols) a.scale_col[k] = s_lo;
        if (c + 1 < a.cols) a.scale_col[k + 1] = s_hi;
      }
    }
    const std::int64_t row_scale_index = srow_base + r * a.row_blocks + c0 / kBlock;
    if ((group & 1) == 0 && in_tensor) {
      if constexpr (M == Mode::PartialAmax) {
        a.amax_row[row_scale_index] = amax_bits(row_max);
      } else {
        a.scale_row[row_scale_index] = scale_from_magnitude(row_max);
      }
    }
  }
}

__global__ void scales_from_amax_kernel(const std::uint32_t* amax_row, const std::uint32_t* amax_col,
                                        std::uint8_t* scale_row, std::uint8_t* scale_col, std::int64_t n_row,
                                        std::int64_t n_col) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n_row + n_col;
       k += stride) {
    if (k < n_row) {
      scale_row[k] = scale_from_amax_bits(amax_row[k]);
    } else {
      scale_col[k - n_row] = scale_from_amax_bits(amax_col[k - n_row]);
    }
  }
}

__global__ void dequantize_kernel(std::int64_t rows, std::int64_t cols, std::int64_t n, bool rowwise,
                                  const std::uint8_t* data, const std::uint8_t* scale, float* out) {
  const std::int64_t row_blocks = (cols + kBlock - 1) / kBlock, col_blocks = (rows + kBlock - 1) / kBlock;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::int64_t row = e / cols, c = e - row * cols;  // row counted across members
    const std::int64_t g = row / rows, r = row - g * rows;
    const std::int64_t k = rowwise ? row * row_blocks + c / kBlock : (g * col_blocks + r / kBlock) * cols + c;
    out[e] = decode_element(data[e], scale[k]);
  }
}

TileArgs geometry(const Mxfp8Shape& s) {
  TileArgs a;
  a.rows = s.rows;
  a.cols = s.cols;
  a.row_tiles = (s.rows + kTileRows - 1) / kTileRows;
  a.col_tiles = (s.cols + kTileCols - 1) / kTileCols;
  a.row_blocks = s.row_blocks();
  a.col_blocks = s.col_blocks();
  // The kernel indexes tiles with 32-bit integers.
  SHARDOPT_REQUIRE(s.members * a.row_tiles * a.col_tiles <= 0x7FFFFFFF, ErrorCode::InvalidArgument,
                   "MXFP8 tensor of more than 2^31 tiles of 32 x 128 elements; split it into smaller tensors");
  return a;
}

// Global tile row (member-major) of flat element i.
std::int64_t tile_row_of(const TileArgs& a, std::int64_t i) {
  const std::int64_t global_row = i / a.cols;
  return (global_row / a.rows) * a.row_tiles + (global_row % a.rows) / kTileRows;
}

template <Mode M>
void launch_tiles(const TileArgs& a, std::int64_t tiles, Stream stream) {
  if (tiles <= 0) return;
  tile_kernel<M><<<static_cast<unsigned>(tiles), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(a);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

// The tiles of the range: every tile row that holds one of its elements.
template <Mode M>
void launch_range(TileArgs a, Range range, Stream stream) {
  if (range.size() <= 0) return;
  a.begin = range.begin;
  a.end = range.end;
  const std::int64_t first_row = tile_row_of(a, range.begin);
  const std::int64_t last_row = tile_row_of(a, range.end - 1);
  a.first_tile = first_row * a.col_tiles;
  launch_tiles<M>(a, (last_row - first_row + 1) * a.col_tiles, stream);
}

int elementwise_blocks(std::int64_t n) {
  return static_cast<int>(std::clamp<std::int64_t>((n + 255) / 256, 1, 65536));
}

}  // namespace

void launch_partial_scales(const Mxfp8Shape& shape, Range range, const float* master, std::uint8_t* scale_row,
                           std::uint8_t* scale_col, Stream stream) {
  TileArgs a = geometry(shape);
  a.master = master;
  a.scale_row = scale_row;
  a.scale_col = scale_col;
  launch_range<Mode::PartialScales>(a, range, stream);
}

void launch_partial_amax(const Mxfp8Shape& shape, Range range, const float* master, std::uint32_t* amax_row,
                         std::uint32_t* amax_col, Stream stream) {
  TileArgs a = geometry(shape);
  a.master = master;
  a.amax_row = amax_row;
  a.amax_col = amax_col;
  launch_range<Mode::PartialAmax>(a, range, stream);
}

void launch_scales_from_amax(const Mxfp8Shape& shape, const std::uint32_t* amax_row, const std::uint32_t* amax_col,
                             std::uint8_t* scale_row, std::uint8_t* scale_col, Stream stream) {
  const std::int64_t n_row = shape.scale_row_numel(), n_col = shape.scale_col_numel();
  scales_from_amax_kernel<<<elementwise_blocks(n_row + n_col), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      amax_row, amax_col, scale_row, scale_col, n_row, n_col);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_shard_data(const Mxfp8Shape& shape, Range range, const float* master, const std::uint8_t* scale_row,
                       const std::uint8_t* scale_col, std::uint8_t* data_row, std::uint8_t* data_col, Stream stream) {
  TileArgs a = geometry(shape);
  a.master = master;
  a.in_scale_row = scale_row;
  a.in_scale_col = scale_col;
  a.data_row = data_row;
  a.data_col = data_col;
  launch_range<Mode::ShardData>(a, range, stream);
}

void launch_dequantize(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data, const std::uint8_t* scale,
                       float* out, Stream stream) {
  dequantize_kernel<<<elementwise_blocks(shape.numel()), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      shape.rows, shape.cols, shape.numel(), plane == Mxfp8Plane::Rowwise, data, scale, out);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::mxfp8
