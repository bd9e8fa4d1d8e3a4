// mxfp8_batch.cu - whole-tensor MXFP8 quantization: one tensor (quantize_mxfp8) or a
// list of tensors of any shapes (quantize_mxfp8_batch), each in ONE launch.
//
// Work: tiles of 32 x 128 elements of one member (mxfp8_tile.cuh). The tensors' tiles
// form one sequence (tensor after tensor, member after member, tile rows, tile columns);
// a persistent grid of one to four waves of resident blocks (grid_for) walks it
// grid-stride, so every block gets the same number of tiles (+-1) whatever the mix of
// shapes, and no tensor costs a launch or a partial wave of its own. A tile's tensor comes from the entry table: the
// same entry as the previous tile in the common case, else a binary search over the
// entries' tile ranges (tiles only move forward).
//
// Software pipeline: a block issues the loads of its next tile before it quantizes the
// current one, so a tile's DRAM latency overlaps the previous tile's shuffles, barriers
// and stores, and a block's last tile needs no fresh load.
//
// Per tile (as the former one-tile-per-block kernel, byte for byte): rowwise amax over
// the thread's 16 columns and the neighbour lane (xor 1); columnwise amax over the
// warp's 4 rows (xor 8, 16) and the 8 warps through shared memory; scale bytes; then both
// e4m3 planes from fl32(x * 2^-e) and the hardware's RNE saturating f32x2 -> e4m3x2
// conversion (equal to the host twin's num::f32_to_e4m3 for every input: checked in
// test/gpu/test_mxfp8_convert.cu). The skip flag is read once, together with the first
// tile: when it is nonzero every block leaves before writing anything.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "core/check.hpp"
#include "kernels/mxfp8_launch.hpp"
#include "kernels/mxfp8_math.cuh"
#include "kernels/mxfp8_tile.cuh"

namespace shardopt::mxfp8 {
namespace {

using tile::aligned16;
using tile::kFullMask;
using tile::kGroupCols;
using tile::kThreads;
using tile::kWarps;

// The entry table of quantize_mxfp8: one tensor, passed by value in the kernel's
// parameters.
struct OneTensor {
  BatchEntry entry;
  __device__ const BatchEntry& operator[](int) const { return entry; }
  __device__ int find(std::int64_t, int) const { return 0; }
};

// The entry table of quantize_mxfp8_batch: `count` entries in device memory whose tile
// ranges [first_tile, end_tile) follow each other from 0.
struct TensorList {
  const BatchEntry* entries;
  int count;
  __device__ const BatchEntry& operator[](int e) const { return entries[e]; }
  // The entry of tile `t`, at or after entry `from` (which starts at or before t).
  __device__ int find(std::int64_t t, int from) const {
    if (t < entries[from].end_tile) return from;
    int lo = from + 1, hi = count - 1;  // the first entry whose end_tile > t
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (entries[mid].end_tile > t) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }
};

// `p`, which points to global memory: lets the compiler emit global (not generic)
// stores through pointers it read from the entry table.
template <class T>
__device__ __forceinline__ T* in_global(T* p) {
  __builtin_assume(__isGlobal(p));
  return p;
}

// What a thread needs of its part of a tile.
struct Spot {
  std::int64_t elem;       // flat index of its first element (source and both planes)
  std::int64_t row_scale;  // index of its rowwise scale
  std::int64_t col_scale;  // index of the columnwise scale of the tile's first column
  int hi;                  // valid columns [0, hi) of its 16; 0 outside the tensor
  int col_room;            // valid columns of the tile, capped at 128
};

__device__ __forceinline__ Spot spot_of(const BatchEntry& t, std::int64_t tile_index) {
  // Tile counts of one tensor fit in 32 bits (make_batch_entry checks).
  const std::uint32_t local = static_cast<std::uint32_t>(tile_index - t.first_tile);
  const std::uint32_t g32 = local / t.member_tiles;
  const std::uint32_t in_member = local - g32 * t.member_tiles;
  const std::uint32_t rt32 = in_member / t.col_tiles;
  const std::int64_t g = g32, rt = rt32, ct = in_member - rt32 * t.col_tiles;
  const std::int64_t rows = t.shape.rows, cols = t.shape.cols;
  std::int64_t elem_base, srow_base, scol_base;
  if (t.members != nullptr) {
    const Mxfp8Member m = in_global(t.members)[g];
    elem_base = m.element_offset;
    srow_base = m.scale_row_offset;
    scol_base = m.scale_col_offset;
  } else {
    elem_base = g * rows * cols;
    srow_base = g * rows * t.row_blocks;
    scol_base = g * t.col_blocks * cols;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane & 7;
  const std::int64_t r = rt * kTileRows + warp * 4 + (lane >> 3);
  const std::int64_t c0 = ct * kTileCols + group * kGroupCols;
  Spot s;
  s.elem = elem_base + r * cols + c0;
  s.row_scale = srow_base + r * t.row_blocks + c0 / kBlock;
  s.col_scale = scol_base + rt * cols + ct * kTileCols;
  s.hi = (r < rows && c0 < cols) ? static_cast<int>(std::min<std::int64_t>(kGroupCols, cols - c0)) : 0;
  s.col_room = static_cast<int>(std::min<std::int64_t>(kTileCols, cols - ct * kTileCols));
  return s;
}

// The thread's 16 bf16 values as pairs (zero past hi).
__device__ __forceinline__ void load_words(const std::uint16_t* p, int hi, std::uint32_t (&w)[8]) {
  if (hi == kGroupCols && aligned16(p)) {
    const uint4 v0 = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 v1 = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    w[0] = v0.x; w[1] = v0.y; w[2] = v0.z; w[3] = v0.w;
    w[4] = v1.x; w[5] = v1.y; w[6] = v1.z; w[7] = v1.w;
    return;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const std::uint32_t x0 = 2 * k < hi ? p[2 * k] : 0u;
    const std::uint32_t x1 = 2 * k + 1 < hi ? p[2 * k + 1] : 0u;
    w[k] = x0 | (x1 << 16);
  }
}

struct TileShared {
  std::uint32_t col_partial[kWarps][kTileCols / 2];  // per warp: column amaxes, two per word
  float col_inv[kTileCols];                          // 2^-e of each column's scale
  std::uint8_t col_scale[kTileCols];                 // each column's scale byte
};

// Quantizes one tile whose values this thread holds in `w`. Every thread of the block
// calls it (two barriers). Shared memory reuse across calls is safe: col_partial is read
// only between the two barriers, col_inv / col_scale only after the second, and a
// thread's next write of each comes after a barrier that follows all those reads.
__device__ __forceinline__ void quantize_tile(const BatchEntry& t, const Spot& s, const std::uint32_t (&w)[8],
                                              TileShared& sh) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane & 7;

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
    uint4* dst = reinterpret_cast<uint4*>(&sh.col_partial[warp][lane * 8]);
    dst[0] = make_uint4(mag[0], mag[1], mag[2], mag[3]);
    dst[1] = make_uint4(mag[4], mag[5], mag[6], mag[7]);
  }
  __syncthreads();
  if (threadIdx.x < kTileCols / 2) {
    const int j = threadIdx.x;  // tile columns 2j and 2j + 1
    std::uint32_t v = sh.col_partial[0][j];
#pragma unroll
    for (int q = 1; q < kWarps; ++q) v = __vmaxu2(v, sh.col_partial[q][j]);
    const std::uint8_t s_lo = scale_from_magnitude(v & 0xFFFFu), s_hi = scale_from_magnitude(v >> 16);
    std::uint8_t* scale_col = in_global(t.out.scale_col) + s.col_scale + 2 * j;
    if (2 * j < s.col_room) scale_col[0] = s_lo;
    if (2 * j + 1 < s.col_room) scale_col[1] = s_hi;
    sh.col_scale[2 * j] = s_lo;
    sh.col_scale[2 * j + 1] = s_hi;
    sh.col_inv[2 * j] = inverse_scale(s_lo);
    sh.col_inv[2 * j + 1] = inverse_scale(s_hi);
  }
  const std::uint8_t row_scale = scale_from_magnitude(row_max);
  if ((group & 1) == 0 && s.hi > 0) in_global(t.out.scale_row)[s.row_scale] = row_scale;
  __syncthreads();
  if (s.hi == 0) return;
  const uint4 cs4 = *reinterpret_cast<const uint4*>(&sh.col_scale[group * kGroupCols]);
  const std::uint32_t cs[4] = {cs4.x, cs4.y, cs4.z, cs4.w};
  float inv[16];
  const float4* ci = reinterpret_cast<const float4*>(&sh.col_inv[group * kGroupCols]);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float4 v = ci[q];
    inv[4 * q] = v.x; inv[4 * q + 1] = v.y; inv[4 * q + 2] = v.z; inv[4 * q + 3] = v.w;
  }
  tile::encode_and_store(w, row_scale, inv, cs, in_global(t.out.data_row) + s.elem, in_global(t.out.data_col) + s.elem,
                         0, s.hi);
}

// Grid-stride over the `tiles` tiles of `table`, loading tile i + 1 while tile i is
// quantized.
// Resident blocks per SM the grid is sized for. The launch bounds keep the kernel
// within 64 registers a thread (sm_90, nvcc 13.0: 62 and 64, no spills, per
// cuobjdump --dump-resource-usage; capping at 48 for 5 blocks spills), which lets 4
// blocks of 256 threads share an SM's 64K registers; shared memory (2.7 KB a block)
// is no limit.
constexpr int kBlocksPerSm = 4;

template <class Table>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) quantize_kernel(const Table table, const std::int64_t tiles,
                                                            const std::int32_t* skip_flag) {
  __shared__ __align__(16) TileShared sh;
  // The flag's load and the first tile's loads are in flight together; nothing is
  // written before the flag is known.
  const std::int32_t skip = skip_flag != nullptr ? *skip_flag : 0;
  std::int64_t t = blockIdx.x;
  if (t >= tiles) return;
  int e = table.find(t, 0);
  Spot spot = spot_of(table[e], t);
  std::uint32_t w[8];
  load_words(in_global(table[e].src) + spot.elem, spot.hi, w);
  if (skip != 0) return;  // the whole grid leaves together
  for (;;) {
    const std::int64_t next = t + gridDim.x;
    const bool more = next < tiles;  // the same for the whole block
    int e_next = e;
    Spot spot_next = spot;
    std::uint32_t w_next[8];
    if (more) {
      e_next = table.find(next, e);
      spot_next = spot_of(table[e_next], next);
      load_words(in_global(table[e_next].src) + spot_next.elem, spot_next.hi, w_next);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) w_next[k] = 0;
    }
    quantize_tile(table[e], spot, w, sh);
    if (!more) return;
    t = next;
    e = e_next;
    spot = spot_next;
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = w_next[k];
  }
}

// Resident blocks on the current device (kBlocksPerSm on every SM). Only a device
// attribute is queried (cached per device), nothing that a stream capture could object
// to, so a first launch inside a capture is fine.
int resident_blocks() {
  static std::array<std::atomic<int>, 64> cache{};
  int device = 0;
  SHARDOPT_CUDA_CHECK(cudaGetDevice(&device));
  const bool cached = device >= 0 && device < static_cast<int>(cache.size());
  if (cached) {
    const int known = cache[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int sms = 0;
  SHARDOPT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int blocks = std::max(1, sms) * kBlocksPerSm;
  if (cached) cache[static_cast<std::size_t>(device)].store(blocks, std::memory_order_relaxed);
  return blocks;
}

// Blocks of the grid: up to kMaxWaves waves of resident blocks, so that blocks held
// back by other kernels running beside this one (NCCL's, in an optimizer step) are
// taken up by whichever SM frees first instead of running after everything else; but
// at least kMinTilesPerBlock tiles per block unless that leaves less than one wave
// (the prefetch hides a load on every tile after a block's first). The tiles are then
// spread evenly: every block gets ceil(tiles / grid) or one less.
constexpr int kMaxWaves = 4;
constexpr std::int64_t kMinTilesPerBlock = 8;

int grid_for(std::int64_t tiles, int resident) {
  std::int64_t blocks = (tiles + kMinTilesPerBlock - 1) / kMinTilesPerBlock;
  blocks = std::clamp<std::int64_t>(blocks, resident, std::int64_t{resident} * kMaxWaves);
  blocks = std::min(blocks, tiles);
  const std::int64_t per_block = (tiles + blocks - 1) / blocks;
  return static_cast<int>((tiles + per_block - 1) / per_block);
}

}  // namespace

void launch_quantize(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                     const std::int32_t* skip_flag, const Mxfp8Member* table, Stream stream) {
  const OneTensor one{make_batch_entry(shape, src, out, table, 0)};
  const std::int64_t tiles = one.entry.end_tile;
  const int grid = grid_for(tiles, resident_blocks());
  quantize_kernel<OneTensor>
      <<<static_cast<unsigned>(grid), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(one, tiles, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

int batch_grid(std::int64_t tiles) { return grid_for(tiles, resident_blocks()); }

void launch_quantize_batch(const BatchEntry* entries, int count, std::int64_t tiles, int grid,
                           const std::int32_t* skip_flag, Stream stream) {
  quantize_kernel<TensorList><<<static_cast<unsigned>(grid), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      TensorList{entries, count}, tiles, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::mxfp8
