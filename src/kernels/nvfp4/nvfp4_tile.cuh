// nvfp4_tile.cuh - the tile geometry and device helpers of the tiled NVFP4 kernels
// (nvfp4.cu: whole tensors; nvfp4_shard.cu: a rank's ranges), the fast path of tensors
// whose cols is a multiple of 16 (tiled_shape).
//
// A tile is 16 rows (one block row) x S spans of 128 columns (eight 16 x 16 blocks each)
// of one tensor (S = Entry::kTileSpan: 2 for whole tensors, whose bf16 chunks are small,
// 1 for shards); the last tile of a block row may hold fewer blocks, the last block row
// fewer rows. One warp takes a whole tile, with no shared memory and no barrier: lane l
// holds, in each span h, chunk q = l % 16 (8 columns, [128h + 8q, 128h + 8q + 8), half
// a block row of block 8h + q / 2 of the tile) of the 8 rows l / 16 + 2k, k = 0..7. For
// one row k the 32 lanes read two rows of 128 columns: 16-byte loads of 16 lanes are
// 256 contiguous bytes of bf16 (512 of fp32, two loads); a 4-byte store of a chunk's
// codes writes 64 contiguous bytes per row. A block's 16 x 16 elements are then in 4
// lanes (l, l ^ 1, l ^ 16, l ^ 17): its amax is two shuffles away (block_amax).
// With cols % 16 == 0 a chunk is wholly inside or outside the tensor, its first
// element's flat index is a multiple of 8 and its 4 data bytes hold its 8 elements and
// nothing else (element 8m + j in nibble j of the chunk's bytes).
//
// The warps of a launch walk the tiles with a grid stride (warp g of G takes tiles g,
// g + G, ...): the warps running at any moment work on neighbouring tiles. A lane keeps
// 8 rows x S chunks in registers (64 for shards, 32 words of bf16 pairs for whole
// tensors) and issues all their loads before it uses any, so a warp has 8 KB (shards)
// or 4 KB in flight; kBlocksPerSm blocks of 256 threads fit an SM.
//
// Amaxes are integer maxima of amax_bits (f32 bits of |x|, NaN / Inf as 0x7FC00000):
// exact and independent of the order, so the tiles give what the host twin's per-block
// loops give. A tensor's amax: each lane's running max, folded into the tensor's slot
// with one atomicMax per warp and tensor (fold_amax).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/mxfp8/mxfp8_walk.cuh"
#include "kernels/nvfp4/nvfp4_grid.cuh"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "kernels/nvfp4/nvfp4_math.cuh"

namespace shardopt::nvfp4::tile {

inline constexpr int kRows = 16;
inline constexpr int kSpanCols = 128;  // columns of one chunk per lane: one span
inline constexpr int kChunk = 8;       // elements of a chunk
inline constexpr int kLaneRows = 8;    // rows of a tile per lane (l / 16 + 2k)
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;
static_assert(kSpanCols == kSpanBlocks * kNvfp4Block && kRows == kNvfp4Block, "a span is one block row of 8 blocks");
static_assert(2 * kLaneRows == kRows && 16 * kChunk == kSpanCols, "a warp's 32 lanes cover one span of a tile");

/// Blocks of kThreads threads per SM the tile kernels are built for (their launch
/// bounds: at most 128 registers a thread, room for a lane's 64 values of a tile).
inline constexpr int kBlocksPerSm = 2;

/// Blocks of a tile launch over `tiles` tiles: one warp per tile, at most one wave of
/// resident blocks (mxfp8::resident_blocks counts mxfp8::kBlocksPerSm per SM).
inline int grid_for_tiles(std::int64_t tiles) {
  const std::int64_t resident = std::int64_t{mxfp8::resident_blocks()} / mxfp8::kBlocksPerSm * kBlocksPerSm;
  return static_cast<int>(std::clamp<std::int64_t>((tiles + kWarps - 1) / kWarps, 1, resident));
}

/// The lane in its warp, and the warp's first tile and stride of the walk (one tile per
/// warp; the warps of the launch counted from its block size, which may be below kWarps).
__device__ __forceinline__ int lane() { return static_cast<int>(threadIdx.x) & 31; }
__device__ __forceinline__ int block_warps() { return static_cast<int>(blockDim.x) >> 5; }
__device__ __forceinline__ std::int64_t first_tile() {
  return static_cast<std::int64_t>(blockIdx.x) * block_warps() + (static_cast<int>(threadIdx.x) >> 5);
}
__device__ __forceinline__ std::int64_t tile_stride() { return static_cast<std::int64_t>(gridDim.x) * block_warps(); }

/// The lane's chunk q (columns [128h + 8q, 128h + 8q + 8) of the tile for each span h)
/// and its first row in the tile (then every second row).
__device__ __forceinline__ int chunk() { return lane() & 15; }
__device__ __forceinline__ int first_row() { return lane() >> 4; }

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
/// the warp's previous tile (or 0). Tiles are Entry::kTileSpan spans wide.
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

/// The lane's chunk of span h in its row k of a tile: the flat index of its first
/// element and whether it lies inside the tensor (cols % 16 == 0: all 8 elements or
/// none). Its block is block 8h + chunk() / 2 of the tile.
struct Spot {
  std::int64_t elem;
  bool ok;
};
__device__ __forceinline__ Spot spot_of(const Nvfp4Shape& s, const Where& w, int k, int h = 0) {
  const std::int64_t r = w.r0 + first_row() + 2 * k, c = w.c0 + kSpanCols * h + kChunk * chunk();
  return Spot{r * s.cols + c, r < s.rows && c < s.cols};
}

/// Whether the lane's block of span h lies in the tensor (the right edge), and whether
/// the lane writes that block's scale or amax (one lane of the four holding it).
__device__ __forceinline__ bool block_in_tensor(const Nvfp4Shape& s, const Where& w, int h = 0) {
  return w.c0 + kSpanCols * h + kChunk * chunk() < s.cols;
}
__device__ __forceinline__ bool block_writer() { return (lane() & 17) == 0; }

/// The max of the magnitudes of the 8 bf16 of a chunk (w[k]: elements 2k low, 2k + 1
/// high) as bf16 bits; amax_bits of it is the max of the elements' amax_bits (amax_bits
/// is monotone in the magnitude).
__device__ __forceinline__ std::uint32_t chunk_magnitude(const std::uint32_t (&w)[4]) {
  const std::uint32_t m = __vmaxu2(__vmaxu2(w[0] & 0x7FFF7FFFu, w[1] & 0x7FFF7FFFu),
                                   __vmaxu2(w[2] & 0x7FFF7FFFu, w[3] & 0x7FFF7FFFu));
  return max(m & 0xFFFFu, m >> 16);
}
/// amax_bits over the 8 bf16 of a chunk.
__device__ __forceinline__ std::uint32_t chunk_amax(const std::uint32_t (&w)[4]) {
  return amax_bits(static_cast<std::uint16_t>(chunk_magnitude(w)));
}

/// The max of `mine` over the 4 lanes holding one block (l, l ^ 1, l ^ 16, l ^ 17):
/// from each lane's max over its 8 rows of the chunk, the block's max over its 16 x 16
/// elements. Every lane of the warp calls it.
__device__ __forceinline__ std::uint32_t block_max(std::uint32_t mine) {
  mine = max(mine, __shfl_xor_sync(kFullMask, mine, 1));  // the block's 16 columns
  return max(mine, __shfl_xor_sync(kFullMask, mine, 16));  // its 16 rows
}

/// The tensor's amax slot `slot` (u32 bits) raised to the max of the warp's `v`: one
/// atomicMax per warp. Every lane of the warp calls it.
__device__ __forceinline__ void fold_amax(std::uint32_t v, std::uint32_t* slot) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  if (lane() == 0 && v != 0) atomicMax(reinterpret_cast<unsigned int*>(slot), v);
}

/// The 4 data bytes of a chunk: element j (w[j / 2], low half for even j) in nibble j,
/// each encode_nibble of its f32 value (a bf16 half moved into the high half of a word).
__device__ __forceinline__ std::uint32_t encode_chunk(const std::uint32_t (&w)[4], float multiplier) {
  std::uint32_t out = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    out |= encode_nibble(num::f32_from_bits(w[k] << 16), multiplier) << (8 * k);
    out |= encode_nibble(num::f32_from_bits(w[k] & 0xFFFF0000u), multiplier) << (8 * k + 4);
  }
  return out;
}

}  // namespace shardopt::nvfp4::tile
