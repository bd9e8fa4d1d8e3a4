// nvfp4.cu - whole-tensor NVFP4 quantization (one tensor or a list, in the same
// launches) and dequantize.
//
// Quantize reads each tensor twice: pass 1 for the tensor's amax (no element can be
// encoded before it is known), pass 2 for the block amaxes, scales and data. Launches:
//   1. zero_amax:   each tensor's amax slot (one thread per tensor);
//   2. amax:        pass 1 over every tensor, whatever its shape: chunks of kAmaxChunk
//                   consecutive elements, 16-byte loads where the source is aligned;
//                   the integer max of the magnitudes, amax_bits of it, folded into the
//                   tensor's slot (f32 bits, atomicMax) once per block of threads and
//                   tensor (tile::fold_amax). A NaN / Inf counts as 0x7FC00000, above
//                   every finite amax: the slot then holds the NaN flag.
//   3. tiles:       pass 2 of the tensors with cols % 16 == 0 (tiled): one tile of 16
//                   rows x 256 columns at a time (nvfp4_tile.cuh), 16-byte loads, the
//                   block amaxes reduced in registers and shared memory from the values
//                   loaded for encoding (no scratch), the scale bytes, the data bytes (4
//                   per thread), decode_scale from the tensor's first tile. One wave of
//                   resident blocks walks the tiles in runs (mxfp8::Walk), each block
//                   loading its next tile before it quantizes the current one.
//   4. scales, data: pass 2 of the other tensors (odd cols, where a byte may hold two
//                   blocks' elements), one thread per unit (nvfp4_units.cuh): per block
//                   its amax and scale byte (the block-0 thread writes decode_scale), then
//                   per data byte its two codes. (Readable, not fast: these shapes are
//                   rare.)
// Every launch without units is left out. Both passes call the element functions of
// nvfp4_math.cuh that the host twin calls (amax_bits, block_scale, global_scale,
// element_multiplier, encode_element), so the bytes are the twin's. A unit finds its
// tensor by a binary search over the entries' first unit (tiles and chunks: first
// trying the entry of the block's previous one). Every kernel returns at once when the
// device skip flag is set (all read the same flag, so a skipped call writes nothing).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/check.hpp"
#include "kernels/nvfp4_grid.cuh"
#include "kernels/nvfp4_launch.hpp"
#include "kernels/nvfp4_math.cuh"
#include "kernels/nvfp4_tile.cuh"
#include "kernels/nvfp4_units.cuh"

namespace shardopt::nvfp4 {
namespace {

using QuantizeTable = Table<QuantizeEntry>;

__device__ std::uint32_t tensor_amax(const QuantizeEntry& e) {
  return *reinterpret_cast<const std::uint32_t*>(e.out.amax);
}

__global__ void zero_amax_kernel(QuantizeTable t, const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  for (std::int64_t i = first_unit(); i < t.count; i += unit_stride()) *t.at(static_cast<int>(i)).out.amax = 0.0f;
}

// Pass 1: amax_bits over chunk `c` of the tensor (this thread's 64 elements of it).
__device__ __forceinline__ std::uint32_t chunk_amax(const QuantizeEntry& e, std::int64_t c) {
  const std::int64_t n = e.shape.numel(), base = c * kAmaxChunk;
  const std::uint16_t* src = mxfp8::in_global(e.src);
  constexpr int kLoads = static_cast<int>(kAmaxChunk / (8 * kThreads));
  std::uint32_t m = 0;  // max of amax_bits
  if (e.vector_src && base + kAmaxChunk <= n) {
    uint4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j)
      v[j] = __ldg(reinterpret_cast<const uint4*>(src + base + 8 * (j * kThreads + static_cast<int>(threadIdx.x))));
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const std::uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
      m = max(m, tile::chunk_amax(w));
    }
    return m;
  }
  for (int j = 0; j < kLoads; ++j) {
    const std::int64_t i0 = base + 8 * (j * kThreads + static_cast<int>(threadIdx.x));
    for (int k = 0; k < 8; ++k)
      if (i0 + k < n) m = max(m, amax_bits(src[i0 + k]));
  }
  return m;
}

// Pass 1 over the `chunks` chunks of all tensors, block b taking chunks b, b + G, ...;
// a block's running max of one tensor is folded into its slot when the block moves to
// another tensor and at the end.
__global__ void __launch_bounds__(kThreads) amax_kernel(QuantizeTable t, std::int64_t chunks,
                                                        const std::int32_t* skip_flag) {
  __shared__ std::uint32_t folded[tile::kWarps];
  if (skipped(skip_flag)) return;
  int cur = -1;            // the tensor of the block's chunks so far (the same for all threads)
  std::uint32_t run = 0;   // this thread's max over them
  for (std::int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int e = t.find_from(c, cur < 0 ? 0 : cur, &QuantizeEntry::first_chunk);
    if (e != cur) {
      if (cur >= 0) tile::fold_amax(run, reinterpret_cast<std::uint32_t*>(t.at(cur).out.amax), folded);
      cur = e;
      run = 0;
    }
    const QuantizeEntry& en = t.at(e);
    run = max(run, chunk_amax(en, c - en.first_chunk));
  }
  if (cur >= 0) tile::fold_amax(run, reinterpret_cast<std::uint32_t*>(t.at(cur).out.amax), folded);
}

// Pass 2 of tiled tensors: tiles of 16 rows x 256 columns (two spans, 16 blocks), each
// thread two chunks of 8 bf16 (span h at w[4h..4h+3]).
inline constexpr int kSpans = QuantizeEntry::kTileSpan;
inline constexpr int kTileBlocks = kSpans * kSpanBlocks;

// The thread's chunks of the tile at `at` (zero outside the tensor).
__device__ __forceinline__ void load_tile(const QuantizeEntry& e, const tile::Where& at, std::uint32_t (&w)[4 * kSpans]) {
#pragma unroll
  for (int h = 0; h < kSpans; ++h) {
    std::uint32_t* x = w + 4 * h;
    const tile::Spot s = tile::spot_of(e.shape, at, h);
    if (!s.ok) {
      x[0] = x[1] = x[2] = x[3] = 0;
      continue;
    }
    const std::uint16_t* p = mxfp8::in_global(e.src) + s.elem;
    if (e.vector_src) {  // s.elem is a multiple of 8: 16-byte aligned
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      x[0] = v.x;
      x[1] = v.y;
      x[2] = v.z;
      x[3] = v.w;
      continue;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
      x[k] = static_cast<std::uint32_t>(p[2 * k]) | (static_cast<std::uint32_t>(p[2 * k + 1]) << 16);
  }
}

// The 4 elements' words of span h (w + 4h) as an array reference.
__device__ __forceinline__ const std::uint32_t (&span_words(const std::uint32_t (&w)[4 * kSpans], int h))[4] {
  return *reinterpret_cast<const std::uint32_t(*)[4]>(w + 4 * h);
}

// The tile's blocks as pass 2 encodes them (shared memory, written by warp 0).
struct TileBlocks {
  float multiplier[kTileBlocks];  // element_multiplier of the block's scale
  std::uint8_t scale[kTileBlocks];
};

// Pass 2 of one tile whose values this thread holds in `w`, of a tensor whose amax bits
// are `tensor` and S_dec `decode`. Every thread of the block calls it (two barriers:
// after the warps' partial block amaxes, after warp 0's scales). Shared memory is reused
// from tile to tile without a third barrier: `partial` is read only between the two
// barriers, `blocks` only after the second, and a thread writes each again only after
// a barrier that every thread reaches after those reads.
__device__ __forceinline__ void quantize_tile(const QuantizeEntry& e, const tile::Where& at,
                                              const std::uint32_t (&w)[4 * kSpans], std::uint32_t tensor, float decode,
                                              std::uint32_t (*partial)[kTileBlocks], TileBlocks& blocks) {
#pragma unroll
  for (int h = 0; h < kSpans; ++h) tile::partial_block_amax<kTileBlocks>(tile::chunk_amax(span_words(w, h)), partial, h);
  __syncthreads();
  if (threadIdx.x < kTileBlocks) {  // warp 0: block b's amax, scale and multiplier
    const int b = static_cast<int>(threadIdx.x);
    const std::uint8_t scale = block_scale(tile::block_amax_of<kTileBlocks>(partial, b), tensor);
    blocks.scale[b] = scale;
    blocks.multiplier[b] = element_multiplier(scale, decode);
    if (at.c0 + b * kNvfp4Block < e.shape.cols) mxfp8::in_global(e.out.scale)[at.scale0 + b] = scale;
    if (b == 0 && at.r0 == 0 && at.c0 == 0) *e.out.decode_scale = decode;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < kSpans; ++h) {
    const tile::Spot s = tile::spot_of(e.shape, at, h);
    if (!s.ok) continue;
    const int b = kSpanBlocks * h + (tile::chunk() >> 1);
    const std::uint8_t scale = blocks.scale[b];
    const std::uint32_t bytes = scale == kScaleRefused ? 0u : tile::encode_chunk(span_words(w, h), blocks.multiplier[b]);
    std::uint8_t* d = mxfp8::in_global(e.out.data) + s.elem / 2;  // a multiple of 4
    if (e.vector_data) {
      *reinterpret_cast<std::uint32_t*>(d) = bytes;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) d[k] = static_cast<std::uint8_t>(bytes >> (8 * k));
    }
  }
}

// Pass 2 over the `tiles` tiles of the tiled tensors: block b takes its runs of the
// walk, loading each tile while it quantizes the one before. The tensor's amax and
// S_dec are read and computed when the block reaches a tile of another tensor.
__global__ void __launch_bounds__(kThreads, mxfp8::kBlocksPerSm)
    tile_kernel(QuantizeTable t, std::int64_t tiles, int run, const std::int32_t* skip_flag) {
  __shared__ std::uint32_t partial[tile::kWarps][kTileBlocks];
  __shared__ TileBlocks blocks;
  if (skipped(skip_flag)) return;
  const mxfp8::Walk<tile::kMaxRun> walk(run);
  std::int64_t u = walk.first;
  if (u >= tiles) return;
  tile::Where at = tile::locate(t, u, 0);
  std::uint32_t w[4 * kSpans];
  load_tile(t.at(at.e), at, w);
  int cached = -1;  // the entry whose amax and S_dec are below (block-uniform)
  std::uint32_t tensor = 0;
  float decode = 0.0f;
  for (;;) {
    const std::int64_t next = tile::next_tile(walk, u);
    const bool more = next < tiles;  // the same for the whole block
    tile::Where at_next = at;
    std::uint32_t w_next[4 * kSpans] = {};
    if (more) {
      at_next = tile::locate(t, next, at.e);
      load_tile(t.at(at_next.e), at_next, w_next);
    }
    const QuantizeEntry& e = t.at(at.e);
    if (at.e != cached) {
      cached = at.e;
      tensor = tensor_amax(e);
      decode = global_scale(tensor).decode;
    }
    quantize_tile(e, at, w, tensor, decode, partial, blocks);
    if (!more) return;
    u = next;
    at = at_next;
#pragma unroll
    for (int k = 0; k < 4 * kSpans; ++k) w[k] = w_next[k];
  }
}

__global__ void scales_kernel(QuantizeTable t, std::int64_t blocks, const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  for (std::int64_t u = first_unit(); u < blocks; u += unit_stride()) {
    const QuantizeEntry& e = t.at(t.find(u, &QuantizeEntry::first_block));
    const std::int64_t b = u - e.first_block;
    const std::uint32_t a = block_amax(e.shape, b, Bf16Source{e.src}, 0, e.shape.numel());
    e.out.scale[b] = block_scale(a, tensor_amax(e));
    if (b == 0) *e.out.decode_scale = global_scale(tensor_amax(e)).decode;
  }
}

__global__ void data_kernel(QuantizeTable t, std::int64_t bytes, const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  for (std::int64_t u = first_unit(); u < bytes; u += unit_stride()) {
    const QuantizeEntry& e = t.at(t.find(u, &QuantizeEntry::first_byte));
    const float decode = global_scale(tensor_amax(e)).decode;
    e.out.data[u - e.first_byte] =
        encode_byte(e.shape, u - e.first_byte, Bf16Source{e.src}, e.out.scale, decode, 0, e.shape.numel());
  }
}

__global__ void dequantize_kernel(Nvfp4Shape s, const std::uint8_t* data, const std::uint8_t* scale,
                                  const float* decode_scale, float* out_f32, std::uint16_t* out_bf16,
                                  const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  const float decode = *decode_scale;
  for (std::int64_t i = first_unit(); i < s.numel(); i += unit_stride()) {
    const float v = decode_at(s, i, data, scale, decode);
    if (out_f32 != nullptr) out_f32[i] = v;
    if (out_bf16 != nullptr) out_bf16[i] = num::f32_to_bf16(v);
  }
}

}  // namespace

void launch_quantize(const QuantizeEntry* entries, int count, const QuantizeEntry& one, const QuantizeUnits& units,
                     const std::int32_t* skip_flag, Stream stream) {
  const QuantizeTable t{entries, count, one};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  zero_amax_kernel<<<grid_for(count), kThreads, 0, s>>>(t, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  const auto amax_grid = static_cast<unsigned>(std::min<std::int64_t>(units.chunks, mxfp8::resident_blocks()));
  amax_kernel<<<amax_grid, kThreads, 0, s>>>(t, units.chunks, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  if (units.tiles > 0) {
    const mxfp8::WalkPlan walk = mxfp8::plan_walk(units.tiles, tile::kMaxRun);
    tile_kernel<<<static_cast<unsigned>(walk.grid), kThreads, 0, s>>>(t, units.tiles, walk.run, skip_flag);
    SHARDOPT_CUDA_CHECK(cudaGetLastError());
  }
  if (units.blocks > 0) {
    scales_kernel<<<grid_for(units.blocks), kThreads, 0, s>>>(t, units.blocks, skip_flag);
    SHARDOPT_CUDA_CHECK(cudaGetLastError());
  }
  if (units.bytes > 0) {
    data_kernel<<<grid_for(units.bytes), kThreads, 0, s>>>(t, units.bytes, skip_flag);
    SHARDOPT_CUDA_CHECK(cudaGetLastError());
  }
}

void launch_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                       const float* decode_scale, float* out_f32, std::uint16_t* out_bf16,
                       const std::int32_t* skip_flag, Stream stream) {
  dequantize_kernel<<<grid_for(shape.numel()), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      shape, data, scale, decode_scale, out_f32, out_bf16, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::nvfp4
