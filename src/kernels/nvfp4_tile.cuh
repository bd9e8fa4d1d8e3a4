// nvfp4_tile.cuh - the tile geometry and device helpers of the tiled NVFP4 kernels
// (nvfp4.cu: whole tensors; nvfp4_shard.cu: a rank's ranges), the fast path of tensors
// whose cols is a multiple of 16 (tiled_shape).
//
// A tile is 16 rows (one block row) x S spans of 128 columns (eight 16 x 16 blocks each)
// of one tensor (S = Entry::kTileSpan: 2 for whole tensors, whose bf16 chunks are small,
// 1 for shards); the last tile of a block row may hold fewer blocks, the last block row
// fewer rows. 256 threads: thread t holds row t / 16 of the tile and in each span h its
// chunk q = t % 16 of 8 columns, [128h + 8q, 128h + 8q + 8), which lies in block
// 8h + q / 2 of the tile. Warp w thus holds rows 2w and 2w + 1, each as 16 consecutive
// chunks per span: a 16-byte load of bf16 per thread reads 256 contiguous bytes per row
// (two 128-byte lines), a 4-byte store of the chunk's codes writes 64.
// With cols % 16 == 0 a chunk is wholly inside or outside the tensor, its first
// element's flat index is a multiple of 8 and its 4 data bytes hold its 8 elements and
// nothing else (element 8m + j in nibble j of the chunk's bytes).
//
// Block amaxes: the 2 lanes of a block row (xor 1), the warp's 2 rows (xor 16), then the
// 8 warps through shared memory (partial_block_amax, block_amax_of). The tensor's amax: each thread's running
// max, folded into the tensor's slot with one atomicMax per block (of threads) and
// tensor (fold_amax). Amaxes are integer maxima of amax_bits (f32 bits of |x|, NaN /
// Inf as 0x7FC00000): exact and independent of the order, so the tiles give what the
// host twin's per-block loops give.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mxfp8_walk.cuh"
#include "kernels/nvfp4_grid.cuh"
#include "kernels/nvfp4_launch.hpp"
#include "kernels/nvfp4_math.cuh"

namespace shardopt::nvfp4::tile {

inline constexpr int kRows = 16;
inline constexpr int kSpanCols = 128;  // columns of one chunk per thread: one span
inline constexpr int kChunk = 8;       // elements of a chunk
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;
static_assert(kSpanCols == kSpanBlocks * kNvfp4Block && kRows == kNvfp4Block, "a span is one block row of 8 blocks");
static_assert(kRows * (kSpanCols / kChunk) == kThreads, "one chunk per thread and span");

/// Longest run of consecutive tiles a block takes (mxfp8::Walk; the MXFP8 batch's).
inline constexpr int kMaxRun = 16;

/// The tile after tile u in a block's walk (the next of its run, or the first of its
/// next run).
__device__ __forceinline__ std::int64_t next_tile(const mxfp8::Walk<kMaxRun>& walk, std::int64_t u) {
  return walk.ends_run(u) ? u + walk.gap : u + 1;
}

/// The thread's row in the tile and its chunk q (columns [128h + 8q, 128h + 8q + 8) of
/// the tile for each span h).
__device__ __forceinline__ int tile_row() { return static_cast<int>(threadIdx.x) >> 4; }
__device__ __forceinline__ int chunk() { return static_cast<int>(threadIdx.x) & 15; }

/// Where a tile is: its entry, first row and column, and the scale index of its first
/// block.
struct Where {
  int e;
  std::int64_t r0, c0, scale0;
};

/// The first block row of an entry's tiles: 0 for a whole tensor, the first touched
/// block row of a shard.
__device__ __forceinline__ std::int64_t first_block_row(const QuantizeEntry&) { return 0; }
__device__ __forceinline__ std::int64_t first_block_row(const ShardEntry& e) { return e.first_block_row; }

/// Where tile u (of the sequence over the entries' first_tile) is; `from`: the entry of
/// the block's previous tile (or 0). Tiles are Entry::kTileSpan spans wide.
template <class Entry>
__device__ __forceinline__ Where locate(const Table<Entry>& t, std::int64_t u, int from) {
  Where w;
  w.e = t.find_from(u, from, &Entry::first_tile);
  const Entry& en = t.at(w.e);
  const std::int64_t local = u - en.first_tile;
  std::int64_t tr;
  if ((local >> 32) == 0 && (en.tiles_across >> 32) == 0) {  // the usual case: 32-bit division
    tr = static_cast<std::uint32_t>(local) / static_cast<std::uint32_t>(en.tiles_across);
  } else {
    tr = local / en.tiles_across;
  }
  const std::int64_t tc = local - tr * en.tiles_across;
  const std::int64_t br = first_block_row(en) + tr;
  w.r0 = br * kRows;
  w.c0 = tc * (kSpanCols * Entry::kTileSpan);
  w.scale0 = br * en.shape.block_cols() + tc * (kSpanBlocks * Entry::kTileSpan);
  return w;
}

/// The thread's chunk of span h of a tile: the flat index of its first element and
/// whether it lies inside the tensor (cols % 16 == 0: all 8 elements or none). Its
/// block is block 8h + chunk() / 2 of the tile.
struct Spot {
  std::int64_t elem;
  bool ok;
};
__device__ __forceinline__ Spot spot_of(const Nvfp4Shape& s, const Where& w, int h = 0) {
  const std::int64_t r = w.r0 + tile_row(), c = w.c0 + kSpanCols * h + kChunk * chunk();
  return Spot{r * s.cols + c, r < s.rows && c < s.cols};
}

/// amax_bits over the 8 bf16 of a chunk (w[k]: elements 2k low, 2k + 1 high): the
/// integer max of the magnitudes, then amax_bits of it (amax_bits is monotone in the
/// magnitude, so this is the max of the elements' amax_bits).
__device__ __forceinline__ std::uint32_t chunk_amax(const std::uint32_t (&w)[4]) {
  const std::uint32_t m = __vmaxu2(__vmaxu2(w[0] & 0x7FFF7FFFu, w[1] & 0x7FFF7FFFu),
                                   __vmaxu2(w[2] & 0x7FFF7FFFu, w[3] & 0x7FFF7FFFu));
  const std::uint32_t top = max(m & 0xFFFFu, m >> 16);
  return amax_bits(static_cast<std::uint16_t>(top));
}

/// Block amaxes of a tile of kBlocks blocks, part one (every thread of the block calls
/// it, once per span h): from every thread's amax `mine` of its chunk of span h, each
/// warp's amax of each block of the span over its two rows, into partial[warp][8h + j]:
/// the 2 lanes of a block row (xor 1), then the warp's two rows (xor 16). The caller
/// then syncs the block and reduces the warps' partials (block_amax_of).
template <int kBlocks>
__device__ __forceinline__ void partial_block_amax(std::uint32_t mine, std::uint32_t (*partial)[kBlocks], int h) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  std::uint32_t a = max(mine, __shfl_xor_sync(kFullMask, mine, 1));  // the block's 16 columns of the row
  a = max(a, __shfl_xor_sync(kFullMask, a, 16));                      // the warp's two rows
  if (lane < 16 && (lane & 1) == 0) partial[warp][kSpanBlocks * h + (lane >> 1)] = a;
}

/// Block amaxes of a tile, part two (after the barrier): the amax of block b of the tile
/// over its 16 rows.
template <int kBlocks>
__device__ __forceinline__ std::uint32_t block_amax_of(const std::uint32_t (*partial)[kBlocks], int b) {
  std::uint32_t v = partial[0][b];
#pragma unroll
  for (int k = 1; k < kWarps; ++k) v = max(v, partial[k][b]);
  return v;
}

/// The tensor's amax slot `slot` (u32 bits) raised to the max of every thread's `v`:
/// one atomicMax for the block. Every thread of the block calls it (two barriers;
/// `folded`: kWarps words of shared memory).
__device__ __forceinline__ void fold_amax(std::uint32_t v, std::uint32_t* slot, std::uint32_t* folded) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  if ((threadIdx.x & 31) == 0) folded[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint32_t m = folded[0];
#pragma unroll
    for (int k = 1; k < kWarps; ++k) m = max(m, folded[k]);
    if (m != 0) atomicMax(reinterpret_cast<unsigned int*>(slot), m);
  }
  __syncthreads();
}

/// The 4 data bytes of a chunk: element j (w[j / 2], low half for even j) in nibble j,
/// each encode_element(x, multiplier).
__device__ __forceinline__ std::uint32_t encode_chunk(const std::uint32_t (&w)[4], float multiplier) {
  std::uint32_t out = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    out |= static_cast<std::uint32_t>(encode_element(static_cast<std::uint16_t>(w[k] & 0xFFFFu), multiplier))
           << (8 * k);
    out |= static_cast<std::uint32_t>(encode_element(static_cast<std::uint16_t>(w[k] >> 16), multiplier))
           << (8 * k + 4);
  }
  return out;
}


}  // namespace shardopt::nvfp4::tile
