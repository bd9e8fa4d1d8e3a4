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
// from shard_tile_kernel: one warp per tile of 16 rows x 128 columns (nvfp4_tile.cuh)
// of the touched block rows, 8 rows x 8 fp32 masters per lane (two 16-byte loads a row
// where the chunk lies in the range and the master is aligned), zero outside the range,
// all loads issued before any is used. Phase 1: the max of the masters' magnitudes per
// block (two shuffles), rounded once to bf16 (master_to_bf16; rounding is monotone, so
// this is the max of the rounded elements), written by one lane per block; each lane's
// running max is folded into the range's amax once per warp and tensor. Phase 2: the
// masters rounded to bf16 pairs (the hardware conversion, equal to master_to_bf16 for
// the finite values it is given), the chunk's 4 bytes (one store when the chunk lies
// in the range), only the bytes of the span, nibbles outside the range 0. The warps of
// one wave of resident blocks walk the tiles with a grid stride; no shared memory, no
// barrier.
// The other tensors take one thread per unit (nvfp4_units.cuh): per touched block (phase
// 1), per span byte (phase 2). Launches without units are left out.
// A unit finds its tensor by a binary search over the entries' first unit (tiles: first
// trying the entry of the warp's previous tile).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "kernels/common/kernel_files.hpp"
#include "kernels/nvfp4/nvfp4_grid.cuh"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "kernels/nvfp4/nvfp4_math.cuh"
#include "kernels/nvfp4/nvfp4_tile.cuh"
#include "kernels/nvfp4/nvfp4_units.cuh"

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

static_assert(ShardEntry::kTileSpan == 1, "one chunk of 8 masters per lane and row");

// The lane's chunk in its row k of a tile and the part of it in the range: elements
// [lo, hi) of its 8 (lo == hi: none, also outside the tensor).
struct ShardSpot {
  std::int64_t elem;
  int lo, hi;
};
__device__ __forceinline__ ShardSpot shard_spot(const ShardEntry& e, const tile::Where& at, int k) {
  const tile::Spot s = tile::spot_of(e.shape, at, k);
  ShardSpot p{s.elem, 0, 0};
  if (!s.ok) return p;
  const std::int64_t lo = e.range.begin - s.elem, hi = e.range.end - s.elem;
  p.lo = static_cast<int>(lo < 0 ? 0 : lo > tile::kChunk ? tile::kChunk : lo);
  p.hi = static_cast<int>(hi < 0 ? 0 : hi > tile::kChunk ? tile::kChunk : hi);
  if (p.hi < p.lo) p.hi = p.lo;
  return p;
}

// The lane's 8 masters of its row k of a tile (zero outside the range), as loaded.
struct Masters {
  float4 v[2];
};

__device__ __forceinline__ void load_masters(const ShardEntry& e, const tile::Where& at, int k, Masters& m) {
  const ShardSpot p = shard_spot(e, at, k);
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

// The max f32 magnitude bits of the 8 masters (each `bits & 0x7FFFFFFF`: NaNs above
// Inf above every finite value).
__device__ __forceinline__ std::uint32_t magnitude_max(const Masters& m) {
  const float f[tile::kChunk] = {m.v[0].x, m.v[0].y, m.v[0].z, m.v[0].w, m.v[1].x, m.v[1].y, m.v[1].z, m.v[1].w};
  std::uint32_t r = 0;
#pragma unroll
  for (int j = 0; j < tile::kChunk; ++j) r = max(r, num::f32_bits(f[j]) & 0x7FFFFFFFu);
  return r;
}

// bf16 pair of two finite masters by the hardware conversion (cvt.rn.bf16x2.f32): round
// to nearest even, as master_to_bf16, which differs only for NaN (phase 2 encodes no
// element of a tensor holding a NaN or Inf: such a tensor is refused).
__device__ __forceinline__ std::uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return static_cast<std::uint32_t>(__bfloat16_as_ushort(h.x)) |
         (static_cast<std::uint32_t>(__bfloat16_as_ushort(h.y)) << 16);
}

// The 8 values as bf16 pairs (w[k]: elements 2k low, 2k + 1 high); zeros stay 0.
__device__ __forceinline__ void to_words(const Masters& m, std::uint32_t (&w)[4]) {
  w[0] = bf16_pair(m.v[0].x, m.v[0].y);
  w[1] = bf16_pair(m.v[0].z, m.v[0].w);
  w[2] = bf16_pair(m.v[1].x, m.v[1].y);
  w[3] = bf16_pair(m.v[1].z, m.v[1].w);
}

// Whether the tile at `at` is whole: every chunk inside the tensor and the range, the
// master 16-byte and the data 4-byte aligned (warp-uniform). A whole tile takes the
// path without per-chunk checks (its loads and stores step by rows from the lane's first
// chunk).
__device__ __forceinline__ bool whole_tile(const ShardEntry& e, const tile::Where& at) {
  if (!e.vector_master || !e.vector_data) return false;
  if (at.r0 + tile::kRows > e.shape.rows || at.c0 + tile::kSpanCols > e.shape.cols) return false;
  const std::int64_t first = at.r0 * e.shape.cols + at.c0;
  const std::int64_t end = first + (tile::kRows - 1) * e.shape.cols + tile::kSpanCols;
  return first >= e.range.begin && end <= e.range.end;
}

// The lane's first chunk (row first_row() of the tile); its row k is 2k rows further.
__device__ __forceinline__ std::int64_t first_chunk_elem(const ShardEntry& e, const tile::Where& at) {
  return (at.r0 + tile::first_row()) * e.shape.cols + at.c0 + tile::kChunk * tile::chunk();
}

// The lane's 8 rows of masters of a tile. kWhole: the tile is whole (whole_tile).
template <bool kWhole>
__device__ __forceinline__ void load_tile(const ShardEntry& e, const tile::Where& at, Masters (&m)[tile::kLaneRows]) {
  if constexpr (kWhole) {
    const float* p = mxfp8::in_global(e.master) + (first_chunk_elem(e, at) - e.range.begin);
    const std::int64_t row_step = 2 * e.shape.cols;
#pragma unroll
    for (int k = 0; k < tile::kLaneRows; ++k) {
      const float4* src = reinterpret_cast<const float4*>(p + k * row_step);
      m[k].v[0] = __ldg(src);
      m[k].v[1] = __ldg(src + 1);
    }
  } else {
#pragma unroll
    for (int k = 0; k < tile::kLaneRows; ++k) load_masters(e, at, k, m[k]);
  }
}

// Phase 1 of one tile: the amaxes of its blocks (over the range) into the amax buffer,
// by one lane of each block. Returns the lane's block amax (for the range's amax).
// Rounding to bf16 is monotone, so the max over the masters' magnitudes, rounded once
// (master_to_bf16), gives the max of the rounded elements: amax_bits of it is the
// twin's block amax (a NaN or a value rounding to Inf gives kAmaxNonFinite either way).
// Every lane of the warp calls it.
__device__ __forceinline__ std::uint32_t amax_tile(const ShardEntry& e, const tile::Where& at,
                                                   const Masters (&m)[tile::kLaneRows]) {
  std::uint32_t r = 0;
#pragma unroll
  for (int k = 0; k < tile::kLaneRows; ++k) r = max(r, magnitude_max(m[k]));
  r = tile::block_max(r);
  const std::uint32_t a = amax_bits(master_to_bf16(num::f32_from_bits(r)));
  if (tile::block_writer() && tile::block_in_tensor(e.shape, at))
    mxfp8::in_global(e.amax)[at.scale0 + (tile::chunk() >> 1)] = a;
  return a;
}

// Phase 2 of the lane's chunk of row k (a tile that is not whole): the span's bytes of
// it, from the block's scale byte and multiplier.
__device__ __forceinline__ void data_chunk(const ShardEntry& e, const tile::Where& at, int k, const Masters& m,
                                           std::uint8_t scale, float multiplier) {
  const ShardSpot p = shard_spot(e, at, k);
  if (p.lo >= p.hi) return;  // no element of the range (or outside the tensor)
  std::uint32_t bytes = 0;
  if (scale != kScaleRefused) {
    std::uint32_t w[4];
    to_words(m, w);
    bytes = tile::encode_chunk(w, multiplier);
  }
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
  for (int j = 0; j < 4; ++j) {
    const std::int64_t byte = k0 + j;
    if (2 * byte + 1 >= e.range.begin && 2 * byte < e.range.end)
      mxfp8::in_global(e.out.data)[byte - span0] = static_cast<std::uint8_t>(bytes >> (8 * j));
  }
}

// Phase 2 of one tile (a lane's 8 chunks), from the scale bytes written by
// shard_scales_kernel and the tensor's S_dec `decode`. kWhole: the tile is whole, every
// chunk's 4 bytes in one store.
template <bool kWhole>
__device__ __forceinline__ void data_tile(const ShardEntry& e, const tile::Where& at,
                                          const Masters (&m)[tile::kLaneRows], float decode) {
  if (!kWhole && !tile::block_in_tensor(e.shape, at)) return;
  const std::uint8_t scale = mxfp8::in_global(e.out.scale)[at.scale0 + (tile::chunk() >> 1)];
  const float multiplier = element_multiplier(scale, decode);
  if constexpr (kWhole) {
    std::uint8_t* d = mxfp8::in_global(e.out.data) + (first_chunk_elem(e, at) / 2 - e.range.begin / 2);
#pragma unroll
    for (int k = 0; k < tile::kLaneRows; ++k) {
      std::uint32_t bytes = 0;
      if (scale != kScaleRefused) {
        std::uint32_t w[4];
        to_words(m[k], w);
        bytes = tile::encode_chunk(w, multiplier);
      }
      *reinterpret_cast<std::uint32_t*>(d + k * e.shape.cols) = bytes;  // 2 rows: 2 * cols / 2 bytes
    }
  } else {
#pragma unroll
    for (int k = 0; k < tile::kLaneRows; ++k) data_chunk(e, at, k, m[k], scale, multiplier);
  }
}

// Phase P of one tile. kWhole: the tile is whole (whole_tile).
template <Phase P, bool kWhole>
__device__ __forceinline__ std::uint32_t work_tile(const ShardEntry& e, const tile::Where& at, float decode) {
  Masters m[tile::kLaneRows];
  load_tile<kWhole>(e, at, m);
  if constexpr (P == Phase::Amax) {
    return amax_tile(e, at, m);
  } else {
    data_tile<kWhole>(e, at, m, decode);
    return 0;
  }
}

// Phase P over the `tiles` tiles of the tiled tensors, one warp per tile (grid stride
// over warps), each lane issuing the loads of its 8 chunks at once. Phase 1 folds the
// warp's running max of a tensor into the range's amax when it moves to another tensor
// and at the end.
template <Phase P>
__global__ void __launch_bounds__(kThreads, tile::kBlocksPerSm) shard_tile_kernel(ShardTable t, std::int64_t tiles) {
  int cur = -1;                  // the entry of the warp's previous tile (warp-uniform)
  std::uint32_t range_amax = 0;  // phase 1: this lane's max over the warp's tiles of tensor `cur`
  float decode = 0.0f;           // phase 2: S_dec of tensor `cur`
  for (std::int64_t u = tile::first_tile(); u < tiles; u += tile::tile_stride()) {
    const tile::Where at = tile::locate(t, u, cur < 0 ? 0 : cur);
    const ShardEntry& en = t.at(at.e);
    if (at.e != cur) {
      if (P == Phase::Amax && cur >= 0) {
        const ShardEntry& prev = t.at(cur);
        tile::fold_amax(range_amax, mxfp8::in_global(prev.amax) + prev.shape.scale_numel());
        range_amax = 0;
      }
      if (P == Phase::Data) decode = global_scale(mxfp8::in_global(en.amax)[en.shape.scale_numel()]).decode;
      cur = at.e;
    }
    const std::uint32_t a =
        whole_tile(en, at) ? work_tile<P, true>(en, at, decode) : work_tile<P, false>(en, at, decode);
    range_amax = max(range_amax, a);
  }
  if (P == Phase::Amax && cur >= 0) {
    const ShardEntry& last = t.at(cur);
    tile::fold_amax(range_amax, mxfp8::in_global(last.amax) + last.shape.scale_numel());
  }
}

template <Phase P>
void launch_tiles(const ShardTable& t, std::int64_t tiles, cudaStream_t s) {
  shard_tile_kernel<P><<<static_cast<unsigned>(tile::grid_for_tiles(tiles)), kThreads, 0, s>>>(t, tiles);
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

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void nvfp4_shard_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(nvfp4::zero_amax_kernel));
  visit(kernel_symbol(nvfp4::partial_amax_kernel));
  visit(kernel_symbol(nvfp4::shard_scales_kernel));
  visit(kernel_symbol(nvfp4::shard_data_kernel));
  visit(kernel_symbol(nvfp4::shard_tile_kernel<nvfp4::Phase::Amax>));
  visit(kernel_symbol(nvfp4::shard_tile_kernel<nvfp4::Phase::Data>));
}

}  // namespace shardopt::kernels
