// nvfp4_shard.cu - the sharded NVFP4 kernels over one tensor or a list (an
// Nvfp4ShardBatch), the same launches whatever the number of tensors:
//   phase 1: zero_amax_kernel (per amax entry: 0), then the partial amaxes: block
//     amaxes over the range's elements of every block of the block rows the range
//     touches (0 for blocks without such elements), and the range's amax at
//     [scale_numel()] (atomicMax on the bits);
//   phase 2: shard_scales_kernel (per block, its scale byte from the combined amaxes;
//     block 0 also writes the two fp32 values), then the data bytes of a range's byte
//     span (the codes of the range's elements, others' nibbles 0, written at
//     out.data[k - span.begin]).
// The partial amaxes and the data bytes of tensors with cols % 16 == 0 (tiled) come
// from shard_tile_kernel: tiles of 16 rows x 128 columns (nvfp4_tile.cuh) of the touched
// block rows, 8 fp32 masters per thread (two 16-byte loads where the chunk lies in the
// range and the master is aligned), rounded to bf16 (master_to_bf16) and zero outside
// the range; phase 1 reduces the block amaxes in registers and shared memory (warp 0
// writes them) and folds each block's running max into the range's amax once per
// tensor; phase 2 writes the
// chunk's 4 bytes (one store when the chunk lies in the range), only the bytes of the
// span, nibbles outside the range 0. One wave of resident blocks walks the tiles in runs
// (mxfp8::Walk), each block loading its next tile before it works on the current one.
// The other tensors take one thread per unit (nvfp4_units.cuh): per touched block (phase
// 1), per span byte (phase 2). Launches without units are left out.
// A unit finds its tensor by a binary search over the entries' first unit (tiles: first
// trying the entry of the block's previous tile).
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "kernels/nvfp4_grid.cuh"
#include "kernels/nvfp4_launch.hpp"
#include "kernels/nvfp4_math.cuh"
#include "kernels/nvfp4_tile.cuh"
#include "kernels/nvfp4_units.cuh"

namespace shardopt::nvfp4 {
namespace {

using ShardTable = Table<ShardEntry>;

__global__ void zero_amax_kernel(ShardTable t, std::int64_t units) {
  for (std::int64_t u = first_unit(); u < units; u += unit_stride()) {
    const ShardEntry& e = t.at(t.find(u, &ShardEntry::first_amax));
    e.amax[u - e.first_amax] = 0;
  }
}

__global__ void partial_amax_kernel(ShardTable t, std::int64_t units) {
  for (std::int64_t u = first_unit(); u < units; u += unit_stride()) {
    const ShardEntry& e = t.at(t.find(u, &ShardEntry::first_touched));
    const std::int64_t b = e.touched.begin + (u - e.first_touched);
    const std::uint32_t a =
        block_amax(e.shape, b, MasterSource{e.master, e.range.begin}, e.range.begin, e.range.end);
    e.amax[b] = a;
    if (a != 0) atomicMax(reinterpret_cast<unsigned int*>(e.amax + e.shape.scale_numel()), a);
  }
}

__global__ void shard_scales_kernel(ShardTable t, std::int64_t units) {
  for (std::int64_t u = first_unit(); u < units; u += unit_stride()) {
    const ShardEntry& e = t.at(t.find(u, &ShardEntry::first_block));
    const std::int64_t b = u - e.first_block;
    const std::uint32_t tensor = e.amax[e.shape.scale_numel()];
    e.out.scale[b] = block_scale(e.amax[b], tensor);
    if (b == 0) {
      const GlobalScale g = global_scale(tensor);
      *e.out.amax = g.amax;
      *e.out.decode_scale = g.decode;
    }
  }
}

__global__ void shard_data_kernel(ShardTable t, std::int64_t units) {
  for (std::int64_t u = first_unit(); u < units; u += unit_stride()) {
    const ShardEntry& e = t.at(t.find(u, &ShardEntry::first_byte));
    const float decode = global_scale(e.amax[e.shape.scale_numel()]).decode;
    const std::int64_t j = u - e.first_byte;  // the byte's index in the shard's span
    e.out.data[j] = encode_byte(e.shape, e.range.begin / 2 + j, MasterSource{e.master, e.range.begin}, e.out.scale,
                                decode, e.range.begin, e.range.end);
  }
}

// ------------------------------------------------------------------ tiled tensors

enum class Phase { Amax, Data };

inline constexpr int kTileBlocks = ShardEntry::kTileSpan * kSpanBlocks;  // 8: one span
static_assert(ShardEntry::kTileSpan == 1, "one chunk of 8 masters per thread");

// The thread's chunk of a tile and the part of it in the range: elements [lo, hi) of
// its 8 (lo == hi: none, also outside the tensor).
struct ShardSpot {
  std::int64_t elem;
  int lo, hi;
};
__device__ __forceinline__ ShardSpot shard_spot(const ShardEntry& e, const tile::Where& at) {
  const tile::Spot s = tile::spot_of(e.shape, at);
  ShardSpot p{s.elem, 0, 0};
  if (!s.ok) return p;
  const std::int64_t lo = e.range.begin - s.elem, hi = e.range.end - s.elem;
  p.lo = static_cast<int>(lo < 0 ? 0 : lo > tile::kChunk ? tile::kChunk : lo);
  p.hi = static_cast<int>(hi < 0 ? 0 : hi > tile::kChunk ? tile::kChunk : hi);
  if (p.hi < p.lo) p.hi = p.lo;
  return p;
}

// The thread's 8 masters of a tile (zero outside the range), as loaded.
struct Masters {
  float4 v[2];
};

__device__ __forceinline__ void load_masters(const ShardEntry& e, const tile::Where& at, Masters& m) {
  const ShardSpot p = shard_spot(e, at);
  if (p.lo == 0 && p.hi == tile::kChunk && e.vector_master) {  // 16-byte aligned: e.vector_master, elem % 8 == 0
    const float4* src = reinterpret_cast<const float4*>(mxfp8::in_global(e.master) + (p.elem - e.range.begin));
    m.v[0] = __ldg(src);
    m.v[1] = __ldg(src + 1);
    return;
  }
  float f[tile::kChunk];
#pragma unroll
  for (int j = 0; j < tile::kChunk; ++j)
    f[j] = j >= p.lo && j < p.hi ? __ldg(mxfp8::in_global(e.master) + (p.elem + j - e.range.begin)) : 0.0f;
  m.v[0] = make_float4(f[0], f[1], f[2], f[3]);
  m.v[1] = make_float4(f[4], f[5], f[6], f[7]);
}

__device__ __forceinline__ std::uint32_t bf16_pair(float lo, float hi) {
  return static_cast<std::uint32_t>(master_to_bf16(lo)) | (static_cast<std::uint32_t>(master_to_bf16(hi)) << 16);
}

// The 8 values as bf16 pairs (w[k]: elements 2k low, 2k + 1 high); zeros stay 0.
__device__ __forceinline__ void to_words(const Masters& m, std::uint32_t (&w)[4]) {
  w[0] = bf16_pair(m.v[0].x, m.v[0].y);
  w[1] = bf16_pair(m.v[0].z, m.v[0].w);
  w[2] = bf16_pair(m.v[1].x, m.v[1].y);
  w[3] = bf16_pair(m.v[1].z, m.v[1].w);
}

// Phase 1 of one tile: the amaxes of its blocks (over the range) into the amax buffer,
// by warp 0. Returns the thread's chunk amax (for the range's amax). Every thread of the
// block calls it (one barrier). `partial` alternates between two buffers from one tile
// to the next: a thread writes a buffer again only after the barrier of the tile in
// between, which every thread (warp 0 too) reaches after its reads of that buffer.
__device__ __forceinline__ std::uint32_t amax_tile(const ShardEntry& e, const tile::Where& at,
                                                   const std::uint32_t (&w)[4], std::uint32_t (*partial)[kTileBlocks]) {
  const std::uint32_t mine = tile::chunk_amax(w);
  tile::partial_block_amax<kTileBlocks>(mine, partial, 0);
  __syncthreads();
  if (threadIdx.x < kTileBlocks) {  // block b, if it lies in the tensor
    const int b = static_cast<int>(threadIdx.x);
    if (at.c0 + b * kNvfp4Block < e.shape.cols) mxfp8::in_global(e.amax)[at.scale0 + b] = tile::block_amax_of<kTileBlocks>(partial, b);
  }
  return mine;
}

// Phase 2 of one tile (no barrier): the span's bytes of the thread's chunk, from the
// scale bytes written by shard_scales_kernel and the tensor's S_dec `decode`.
__device__ __forceinline__ void data_tile(const ShardEntry& e, const tile::Where& at, const std::uint32_t (&w)[4],
                                          float decode) {
  const ShardSpot p = shard_spot(e, at);
  if (p.lo >= p.hi) return;  // no element of the range (or outside the tensor)
  const std::uint8_t scale = mxfp8::in_global(e.out.scale)[at.scale0 + (tile::chunk() >> 1)];
  std::uint32_t bytes = scale == kScaleRefused ? 0u : tile::encode_chunk(w, element_multiplier(scale, decode));
  const std::int64_t k0 = p.elem / 2, span0 = e.range.begin / 2;  // k0: a multiple of 4
  if (p.lo == 0 && p.hi == tile::kChunk && e.vector_data) {     // 4 bytes of the span, aligned
    *reinterpret_cast<std::uint32_t*>(mxfp8::in_global(e.out.data) + (k0 - span0)) = bytes;
    return;
  }
  // Nibbles of elements outside the range are 0; a byte is the span's when one of its
  // two elements is in the range: 2k + 1 >= begin and 2k < end.
  const std::uint32_t high = p.hi == tile::kChunk ? 0xFFFFFFFFu : (1u << (4 * p.hi)) - 1u;
  bytes &= high & ~((1u << (4 * p.lo)) - 1u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const std::int64_t byte = k0 + k;
    if (2 * byte + 1 >= e.range.begin && 2 * byte < e.range.end)
      mxfp8::in_global(e.out.data)[byte - span0] = static_cast<std::uint8_t>(bytes >> (8 * k));
  }
}

// Phase P over the `tiles` tiles of the tiled tensors: block b takes its runs of the
// walk, loading each tile while it works on the one before. Phase 1 folds the block's
// running max of a tensor into the range's amax when it moves to another tensor and at
// the end.
template <Phase P>
__global__ void __launch_bounds__(kThreads, mxfp8::kBlocksPerSm)
    shard_tile_kernel(ShardTable t, std::int64_t tiles, int run) {
  __shared__ std::uint32_t partial[2][tile::kWarps][kTileBlocks];
  __shared__ std::uint32_t folded[tile::kWarps];
  const mxfp8::Walk<tile::kMaxRun> walk(run);
  std::int64_t u = walk.first;
  if (u >= tiles) return;
  tile::Where at = tile::locate(t, u, 0);
  Masters m;
  load_masters(t.at(at.e), at, m);
  std::uint32_t range_amax = 0;  // phase 1: this thread's max over the block's tiles of tensor at.e
  int buf = 0;
  int cached = -1;       // phase 2: the entry whose S_dec is `decode` (block-uniform)
  float decode = 0.0f;
  for (;;) {
    const std::int64_t next = tile::next_tile(walk, u);
    const bool more = next < tiles;  // the same for the whole block
    tile::Where at_next = at;
    Masters m_next;
    if (more) {
      at_next = tile::locate(t, next, at.e);
      load_masters(t.at(at_next.e), at_next, m_next);
    }
    const ShardEntry& en = t.at(at.e);
    std::uint32_t w[4];
    to_words(m, w);
    if constexpr (P == Phase::Amax) {
      range_amax = max(range_amax, amax_tile(en, at, w, partial[buf]));
      buf ^= 1;
      if (!more || at_next.e != at.e) {  // block-uniform
        tile::fold_amax(range_amax, mxfp8::in_global(en.amax) + en.shape.scale_numel(), folded);
        range_amax = 0;
      }
    } else {
      if (at.e != cached) {
        cached = at.e;
        decode = global_scale(mxfp8::in_global(en.amax)[en.shape.scale_numel()]).decode;
      }
      data_tile(en, at, w, decode);
    }
    if (!more) return;
    u = next;
    at = at_next;
    m = m_next;
  }
}

template <Phase P>
void launch_tiles(const ShardTable& t, std::int64_t tiles, cudaStream_t s) {
  const mxfp8::WalkPlan walk = mxfp8::plan_walk(tiles, tile::kMaxRun);
  shard_tile_kernel<P><<<static_cast<unsigned>(walk.grid), kThreads, 0, s>>>(t, tiles, walk.run);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_partial_amax(const ShardEntry* entries, int count, const ShardEntry& one, const ShardUnits& units,
                         Stream stream) {
  const ShardTable t{entries, count, one};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  zero_amax_kernel<<<grid_for(units.amax), kThreads, 0, s>>>(t, units.amax);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  if (units.tiles > 0) launch_tiles<Phase::Amax>(t, units.tiles, s);
  if (units.touched > 0) {
    partial_amax_kernel<<<grid_for(units.touched), kThreads, 0, s>>>(t, units.touched);
    SHARDOPT_CUDA_CHECK(cudaGetLastError());
  }
}

void launch_quantize_shard(const ShardEntry* entries, int count, const ShardEntry& one, const ShardUnits& units,
                           Stream stream) {
  const ShardTable t{entries, count, one};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  shard_scales_kernel<<<grid_for(units.blocks), kThreads, 0, s>>>(t, units.blocks);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  if (units.tiles > 0) launch_tiles<Phase::Data>(t, units.tiles, s);
  if (units.bytes > 0) {
    shard_data_kernel<<<grid_for(units.bytes), kThreads, 0, s>>>(t, units.bytes);
    SHARDOPT_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace shardopt::nvfp4
