// nvfp4.cu - whole-tensor NVFP4 quantization (one tensor or a list, in the same
// launches). The decode (one tensor or a list) is in nvfp4_decode.cu.
//
// Quantize reads each tensor twice: pass 1 for the tensor's amax (no element can be
// encoded before it is known), pass 2 for the block amaxes, scales and data. Launches:
//   1. zero_amax:   each tensor's amax slot (one thread per tensor);
//   2. amax:        pass 1 over every tensor, whatever its shape: chunks of kAmaxChunk
//                   consecutive elements, 16-byte loads where the source is aligned,
//                   each chunk split into 1, 2, 4 or 8 parts (a block each) so that a
//                   small tensor's pass still spreads over the SMs (amax_geometry); the
//                   integer max of the magnitudes, amax_bits of it, folded into the
//                   tensor's slot (f32 bits, atomicMax) once per block and tensor
//                   (fold_block). A NaN / Inf counts as 0x7FC00000, above every
//                   finite amax: the slot then holds the NaN flag.
//   3. tiles:       pass 2 of the tensors with cols % 16 == 0 (tiled): one warp per tile
//                   of 16 rows x 256 columns (nvfp4_tile.cuh), 16-byte loads, the block
//                   amaxes by two shuffles from the values loaded for encoding (no
//                   scratch, no shared memory, no barrier), the scale bytes, the data
//                   bytes (4 per chunk), decode_scale from the tensor's first tile. The
//                   warps of one wave of resident blocks walk the tiles with a grid
//                   stride, each lane issuing the loads of its 16 chunks at once; blocks
//                   of fewer than 8 warps when the tiles are too few to give every SM a
//                   block of 8 (tile_geometry), so that small tensors use every SM.
//   4. scales, data: pass 2 of the other tensors (odd cols, where a byte may hold two
//                   blocks' elements), one thread per unit (nvfp4_units.cuh): per block
//                   its amax and scale byte (the block-0 thread writes decode_scale), then
//                   per data byte its two codes. (Readable, not fast: these shapes are
//                   rare.)
// Every launch without units is left out. Both passes call the element functions of
// nvfp4_math.cuh that the host twin calls (amax_bits, block_scale, global_scale,
// element_multiplier, encode_nibble), so the bytes are the twin's. A unit finds its
// tensor by a binary search over the entries' first unit (chunks: first trying the
// entry of the block's previous chunk; tiles: of the warp's previous tile). Every kernel
// returns at once when the device skip flag is set (all read the same flag, so a
// skipped call writes nothing).
//
// The quantize launches are programmatic dependent launches (launch_dependent,
// kernels/common/dependent_launch.cuh): each may be scheduled while the one before it
// runs, and every thread waits for that one (griddepcontrol.wait) before it touches
// global memory - the skip flag, the table, the amax slot, the source. The split of the
// amax chunks and the tile kernel's block size change only which thread reads which
// element: every amax is an integer max, every byte comes from the same element math.
// Before its wait, the amax pass of one tensor asks L2 for its first source lines
// (prefetch_part), which overlaps its first DRAM round trip with the zeroing launch.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/check.hpp"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/kernel_files.hpp"
#include "kernels/nvfp4/nvfp4_grid.cuh"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "kernels/nvfp4/nvfp4_math.cuh"
#include "kernels/nvfp4/nvfp4_tile.cuh"
#include "kernels/nvfp4/nvfp4_units.cuh"

namespace shardopt::nvfp4 {
namespace {

using QuantizeTable = Table<QuantizeEntry>;

__device__ std::uint32_t tensor_amax(const QuantizeEntry& e) {
  return *reinterpret_cast<const std::uint32_t*>(e.out.amax);
}

// The first two calls of every quantize kernel (dependent_launch.cuh): wait for the
// grid before, then let the next one be scheduled.
__device__ __forceinline__ void start_dependent() {
  kernels::wait_for_previous_grid();
  kernels::allow_next_grid();
}

__global__ void zero_amax_kernel(QuantizeTable t, const std::int32_t* skip_flag) {
  start_dependent();
  if (skipped(skip_flag)) return;
  for (std::int64_t i = first_unit(); i < t.count; i += unit_stride()) *t.at(static_cast<int>(i)).out.amax = 0.0f;
}

// A chunk of the amax pass is kSegments segments of 8 * kThreads elements (one 16-byte
// load per thread each); a part of a chunk is kLoads of them.
inline constexpr int kSegments = static_cast<int>(kAmaxChunk / (8 * kThreads));
inline constexpr std::int64_t kSegment = 8 * kThreads;

// Pass 1: amax_bits over part `p` of chunk `c` of the tensor (this thread's 8 * kLoads
// elements of it: segments [p * kLoads, (p + 1) * kLoads) of the chunk).
template <int kLoads>
__device__ __forceinline__ std::uint32_t chunk_amax(const QuantizeEntry& e, std::int64_t c, int p) {
  const std::int64_t n = e.shape.numel(), base = c * kAmaxChunk + p * kLoads * kSegment;
  const std::uint16_t* src = mxfp8::in_global(e.src);
  std::uint32_t m = 0;  // max of amax_bits
  if (e.vector_src && base + kLoads * kSegment <= n) {
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

// Before the wait of a dependent launch: the source lines of part `p` of chunk `c` of
// `e` (an entry in the kernel's parameters) into L2 (kernels::prefetch_l2, which reads
// nothing), when the part is whole and 16-byte aligned; one thread of the 8 that load
// each 128 bytes.
template <int kLoads>
__device__ __forceinline__ void prefetch_part(const QuantizeEntry& e, std::int64_t c, int p) {
  const std::int64_t base = c * kAmaxChunk + p * kLoads * kSegment;
  if (!e.vector_src || base + kLoads * kSegment > e.shape.numel() || (threadIdx.x & 7) != 0) return;
#pragma unroll
  for (int j = 0; j < kLoads; ++j)
    kernels::prefetch_l2(e.src + base + 8 * (j * kThreads + static_cast<int>(threadIdx.x)));
}

// The tensor's amax slot raised to the max of the block's `v`: one atomicMax per block.
// Every thread of the block calls it (block-uniform; two barriers).
__device__ __forceinline__ void fold_block(std::uint32_t v, float* amax) {
  __shared__ std::uint32_t warp_max[tile::kWarps];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(tile::kFullMask, v, o));
  if (tile::lane() == 0) warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint32_t m = 0;
#pragma unroll
    for (int w = 0; w < tile::kWarps; ++w) m = max(m, warp_max[w]);
    if (m != 0) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
  }
  __syncthreads();  // warp_max is free again
}

// Pass 1 over the `chunks` chunks of all tensors, each in kSegments / kLoads parts (units
// chunk * parts + part), block b taking units b, b + G, ...; the block's running max of
// one tensor is folded into its slot when the block moves to another tensor
// (block-uniform) and at the end.
// One tensor (the entry in the parameters): the block's first part is asked into L2
// before the wait (prefetch_part).
template <int kLoads>
__global__ void __launch_bounds__(kThreads) amax_kernel(QuantizeTable t, std::int64_t chunks,
                                                        const std::int32_t* skip_flag) {
  constexpr int kParts = kSegments / kLoads;
  if (t.list == nullptr && blockIdx.x < chunks * kParts)
    prefetch_part<kLoads>(t.one, blockIdx.x / kParts, static_cast<int>(blockIdx.x % kParts));
  start_dependent();
  if (skipped(skip_flag)) return;
  int cur = -1;            // the tensor of the block's chunks so far (the same for all threads)
  std::uint32_t run = 0;   // this thread's max over them
  for (std::int64_t u = blockIdx.x; u < chunks * kParts; u += gridDim.x) {
    const std::int64_t c = u / kParts;  // (a power of two)
    const int e = t.find_from(c, cur < 0 ? 0 : cur, &QuantizeEntry::first_chunk);
    if (e != cur) {
      if (cur >= 0) fold_block(run, t.at(cur).out.amax);
      cur = e;
      run = 0;
    }
    const QuantizeEntry& en = t.at(e);
    run = max(run, chunk_amax<kLoads>(en, c - en.first_chunk, static_cast<int>(u - c * kParts)));
  }
  if (cur >= 0) fold_block(run, t.at(cur).out.amax);
}

// Pass 2 of tiled tensors: tiles of 16 rows x 256 columns (two spans, 16 blocks), one
// warp per tile; each lane two chunks of 8 bf16 (spans 0 and 1) in each of its 8 rows.
inline constexpr int kSpans = QuantizeEntry::kTileSpan;

// The lane's chunk of span h in its row k of the tile at `at` (zero outside the tensor).
__device__ __forceinline__ void load_chunk(const QuantizeEntry& e, const tile::Where& at, int k, int h,
                                           std::uint32_t (&x)[4]) {
  const tile::Spot s = tile::spot_of(e.shape, at, k, h);
  if (!s.ok) {
    x[0] = x[1] = x[2] = x[3] = 0;
    return;
  }
  const std::uint16_t* p = mxfp8::in_global(e.src) + s.elem;
  if (e.vector_src) {  // s.elem is a multiple of 8: 16-byte aligned
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    x[j] = static_cast<std::uint32_t>(p[2 * j]) | (static_cast<std::uint32_t>(p[2 * j + 1]) << 16);
}

// The amax bits, S_dec and block_factor of the tensor a warp works on.
struct TensorScale {
  std::uint32_t amax;
  float decode, factor;
};

// Whether the tile at `at` is whole: every chunk inside the tensor, the source 16-byte
// and the data 4-byte aligned (warp-uniform). A whole tile takes the path without
// per-chunk checks (its loads and stores step by rows from the lane's first chunk).
__device__ __forceinline__ bool whole_tile(const QuantizeEntry& e, const tile::Where& at) {
  return e.vector_src && e.vector_data && at.r0 + tile::kRows <= e.shape.rows &&
         at.c0 + kSpans * tile::kSpanCols <= e.shape.cols;
}

// Pass 2 of one tile: every lane loads its 16 chunks, then per span the block amaxes
// (two shuffles), the scale bytes (written by one lane of each block) and multipliers,
// and the data bytes (4 per chunk). decode_scale from the tensor's first tile.
// kWhole: the tile is whole (whole_tile).
template <bool kWhole>
__device__ __forceinline__ void quantize_tile(const QuantizeEntry& e, const tile::Where& at, const TensorScale& ts) {
  // The lane's first chunk (row first_row(), span 0); row k of span h is 2k rows and
  // 128h columns further.
  const std::int64_t elem0 = (at.r0 + tile::first_row()) * e.shape.cols + at.c0 + tile::kChunk * tile::chunk();
  const std::int64_t row_step = 2 * e.shape.cols;
  std::uint32_t w[kSpans][tile::kLaneRows][4];
#pragma unroll
  for (int h = 0; h < kSpans; ++h)
#pragma unroll
    for (int k = 0; k < tile::kLaneRows; ++k) {
      if constexpr (kWhole) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(mxfp8::in_global(e.src) + elem0 + k * row_step +
                                                             h * tile::kSpanCols));
        w[h][k][0] = v.x;
        w[h][k][1] = v.y;
        w[h][k][2] = v.z;
        w[h][k][3] = v.w;
      } else {
        load_chunk(e, at, k, h, w[h][k]);
      }
    }
  const bool refused_tensor = refused(ts.amax);
#pragma unroll
  for (int h = 0; h < kSpans; ++h) {
    std::uint32_t m = 0;  // max magnitude (bf16 bits) of the lane's 8 chunks
#pragma unroll
    for (int k = 0; k < tile::kLaneRows; ++k) m = max(m, tile::chunk_magnitude(w[h][k]));
    const std::uint32_t amax = amax_bits(static_cast<std::uint16_t>(tile::block_max(m)));
    const std::uint8_t scale = refused_tensor ? kScaleRefused : block_scale_of(amax, ts.factor);
    const bool inside = kWhole || tile::block_in_tensor(e.shape, at, h);
    if (inside && tile::block_writer())
      mxfp8::in_global(e.out.scale)[at.scale0 + kSpanBlocks * h + (tile::chunk() >> 1)] = scale;
    if (!inside) continue;
    const float multiplier = element_multiplier(scale, ts.decode);
#pragma unroll
    for (int k = 0; k < tile::kLaneRows; ++k) {
      const std::int64_t elem = elem0 + k * row_step + h * tile::kSpanCols;  // a multiple of 8
      if (!kWhole && !tile::spot_of(e.shape, at, k, h).ok) continue;
      const std::uint32_t bytes = refused_tensor ? 0u : tile::encode_chunk(w[h][k], multiplier);
      std::uint8_t* d = mxfp8::in_global(e.out.data) + elem / 2;
      if (kWhole || e.vector_data) {
        *reinterpret_cast<std::uint32_t*>(d) = bytes;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) d[j] = static_cast<std::uint8_t>(bytes >> (8 * j));
      }
    }
  }
  if (at.r0 == 0 && at.c0 == 0 && tile::lane() == 0) *e.out.decode_scale = ts.decode;
}

// Pass 2 over the `tiles` tiles of the tiled tensors, one warp per tile (grid stride
// over warps). A warp reads its tensor's amax and computes S_dec and the block factor
// when it reaches a tile of another tensor.
// Blocks may have fewer than kThreads threads (tile_geometry): tile::first_tile and
// tile_stride count the warps of the launch.
__global__ void __launch_bounds__(kThreads, tile::kBlocksPerSm)
    tile_kernel(QuantizeTable t, std::int64_t tiles, const std::int32_t* skip_flag) {
  start_dependent();
  if (skipped(skip_flag)) return;
  int cached = -1;  // the entry of `ts` (warp-uniform)
  TensorScale ts{};
  for (std::int64_t u = tile::first_tile(); u < tiles; u += tile::tile_stride()) {
    const tile::Where at = tile::locate(t, u, cached < 0 ? 0 : cached);
    const QuantizeEntry& e = t.at(at.e);
    if (at.e != cached) {
      cached = at.e;
      ts.amax = tensor_amax(e);
      ts.decode = global_scale(ts.amax).decode;
      ts.factor = refused(ts.amax) ? 0.0f : block_factor(ts.amax);
    }
    if (whole_tile(e, at)) {
      quantize_tile<true>(e, at, ts);
    } else {
      quantize_tile<false>(e, at, ts);
    }
  }
}

__global__ void scales_kernel(QuantizeTable t, std::int64_t blocks, const std::int32_t* skip_flag) {
  start_dependent();
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
  start_dependent();
  if (skipped(skip_flag)) return;
  for (std::int64_t u = first_unit(); u < bytes; u += unit_stride()) {
    const QuantizeEntry& e = t.at(t.find(u, &QuantizeEntry::first_byte));
    const float decode = global_scale(tensor_amax(e)).decode;
    e.out.data[u - e.first_byte] =
        encode_byte(e.shape, u - e.first_byte, Bf16Source{e.src}, e.out.scale, decode, 0, e.shape.numel());
  }
}

// The amax pass's launch: `parts` parts a chunk (1, doubled up to 8 while the units,
// chunks x parts, still fit one wave of `resident` blocks) and `grid` blocks (at most
// one wave). Large tensors keep whole chunks (parts 1); small ones reach every SM.
struct AmaxGeometry {
  int parts, grid;
};
AmaxGeometry amax_geometry(std::int64_t chunks, int resident) {
  int parts = 1;
  while (parts < kSegments && chunks * parts * 2 <= resident) parts *= 2;
  return AmaxGeometry{parts, static_cast<int>(std::clamp<std::int64_t>(chunks * parts, 1, resident))};
}

// The tile kernel's launch over `tiles` tiles on `sms` SMs: blocks of kThreads threads (8
// warps) when there are tiles for a block of 8 on every SM; else blocks of 4, 2 or 1
// warps, halved until every SM gets a block (one warp per tile either way); at most one
// wave of tile::kBlocksPerSm blocks of 8 warps a SM.
struct TileGeometry {
  int grid, threads;
};
TileGeometry tile_geometry(std::int64_t tiles, int sms) {
  int warps = tile::kWarps;
  while (warps > 1 && tiles < std::int64_t{warps} * sms) warps /= 2;
  const std::int64_t resident_warps = std::int64_t{sms} * tile::kBlocksPerSm * tile::kWarps;
  const std::int64_t grid = std::clamp<std::int64_t>((tiles + warps - 1) / warps, 1, resident_warps / warps);
  return TileGeometry{static_cast<int>(grid), 32 * warps};
}

// The amax kernel of `parts` parts a chunk (amax_geometry).
using AmaxKernel = void (*)(QuantizeTable, std::int64_t, const std::int32_t*);
AmaxKernel amax_kernel_of(int parts) {
  switch (parts) {
    case 1: return amax_kernel<kSegments>;
    case 2: return amax_kernel<kSegments / 2>;
    case 4: return amax_kernel<kSegments / 4>;
    default: return amax_kernel<kSegments / 8>;
  }
}
static_assert(kSegments == 8, "amax_geometry splits a chunk in at most 8 parts of whole segments");

}  // namespace

void launch_quantize(const QuantizeEntry* entries, int count, const QuantizeEntry& one, const QuantizeUnits& units,
                     const std::int32_t* skip_flag, Stream stream) {
  const QuantizeTable t{entries, count, one};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const int resident = mxfp8::resident_blocks();
  kernels::launch_dependent(zero_amax_kernel, static_cast<unsigned>(grid_for(count)), kThreads, s, t, skip_flag);
  const AmaxGeometry amax = amax_geometry(units.chunks, resident);
  kernels::launch_dependent(amax_kernel_of(amax.parts), static_cast<unsigned>(amax.grid), kThreads, s, t,
                            units.chunks, skip_flag);
  if (units.tiles > 0) {
    const TileGeometry g = tile_geometry(units.tiles, resident / mxfp8::kBlocksPerSm);
    kernels::launch_dependent(tile_kernel, static_cast<unsigned>(g.grid), static_cast<unsigned>(g.threads), s, t,
                              units.tiles, skip_flag);
  }
  if (units.blocks > 0)
    kernels::launch_dependent(scales_kernel, static_cast<unsigned>(grid_for(units.blocks)), kThreads, s, t,
                              units.blocks, skip_flag);
  if (units.bytes > 0)
    kernels::launch_dependent(data_kernel, static_cast<unsigned>(grid_for(units.bytes)), kThreads, s, t, units.bytes,
                              skip_flag);
}

}  // namespace shardopt::nvfp4

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void nvfp4_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(nvfp4::zero_amax_kernel));
  visit(kernel_symbol(nvfp4::amax_kernel<8>));
  visit(kernel_symbol(nvfp4::amax_kernel<4>));
  visit(kernel_symbol(nvfp4::amax_kernel<2>));
  visit(kernel_symbol(nvfp4::amax_kernel<1>));
  visit(kernel_symbol(nvfp4::tile_kernel));
  visit(kernel_symbol(nvfp4::scales_kernel));
  visit(kernel_symbol(nvfp4::data_kernel));
}

}  // namespace shardopt::kernels
