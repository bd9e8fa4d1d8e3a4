// mxfp8_batch.cu - whole-tensor MXFP8 quantization: one tensor (quantize_mxfp8) or a
// list of tensors of any shapes (quantize_mxfp8_batch), each in ONE launch.
//
// Work: tiles of 32 x 128 elements of one member (mxfp8_tile.cuh). The tensors' tiles
// form one sequence (tensor after tensor, member after member, tile rows, tile columns).
// One wave of resident blocks walks it in interleaved runs (Walk): block b takes runs
// b, b + G, b + 2G, ... (G blocks) of R consecutive tiles (R a power of two). The blocks
// running at any moment then work on G * R neighbouring tiles, which DRAM serves better
// than blocks walking distant parts of the sequence: every block getting one contiguous
// share gave 81.7% of copy bandwidth on the H200 embedding and 82.1% on the batch.
// Within a run a block steps from tile to tile (step(): a few additions along a tile
// row); the first tile of a run takes the tensor's entry (its current one, the next,
// else a binary search over the entries' tile ranges) and two multiply-shift divisions
// (FastDivider). Measured on H200 (decisions.md, "the order of tiles"):
// - one tensor (quantize_mxfp8, entry in the kernel's parameters, so a fresh start is
//   cheap): R = 1, a plain grid stride: 128256 x 2048 embedding 86%, 114 launches in a
//   graph 79%; R = 4 and 16 gave 86.7% and 82.5% on the embedding, 78.3% and 77.2% in
//   the graph.
// - a list of tensors (quantize_mxfp8_batch, entries in global memory): R = 16, 85%;
//   R = 1, 4, 64, 256 gave 77.4%, 82.6%, 82.9%, 79.5%.
// R shrinks for small sequences so that every resident block gets a run. Every block
// gets the same number of tiles (to one run) whatever the mix of shapes, and no tensor
// costs a launch or a partial wave of its own. The price of one wave: a block that
// cannot be resident at launch (another kernel holding its SM) runs its whole share
// after the others finish.
//
// Software pipeline: a block issues the loads of its next tile before it quantizes the
// current one, so a tile's DRAM latency overlaps the previous tile's shuffles, barriers
// and stores, and a block's last tile needs no fresh load.
//
// Per tile: each thread holds two chunks of 8 columns of one row (Spot), loaded and
// stored with full-sector accesses. Rowwise amax over each chunk, then the 4 lanes of
// the 32-column block (xor 1, 2); columnwise amax over the warp's 4 rows (xor 8, 16)
// and the 8 warps through shared memory; scale bytes; then both e4m3 planes from
// fl32(x * 2^-e) and the hardware's RNE saturating f32x2 -> e4m3x2 conversion (equal to
// the host twin's num::f32_to_e4m3 for every input: checked in
// test/gpu/test_mxfp8_convert.cu). NaN blocks are patched to 0x7F only in tiles that
// hold a NaN (one __syncthreads_or tells). Whole tiles of aligned tensors (Spot::full,
// block-uniform) take a copy of the path with every bounds and alignment check compiled
// out. The skip flag is read once, together with the first tile: when it is nonzero
// every block leaves before writing anything.
//
// Both launches are programmatic dependent launches (kernels/common/dependent_launch.cuh):
// the grid may be scheduled while the kernel before it on the stream runs (a small call
// then pays little launch latency of its own), and every thread waits for that kernel
// (griddepcontrol.wait) before it reads the flag, the table or the source. Meanwhile a
// one-tensor launch asks L2 for its first tile's source lines (prefetch_tile), so that
// its first DRAM round trip overlaps the kernel before.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/check.hpp"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/kernel_files.hpp"
#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "kernels/mxfp8/mxfp8_math.cuh"
#include "kernels/mxfp8/mxfp8_tile.cuh"
#include "kernels/mxfp8/mxfp8_walk.cuh"

namespace shardopt::mxfp8 {
namespace {

using tile::aligned16;
using tile::kFullMask;
using tile::kThreads;
using tile::kWarps;

// The entry tables: one tensor (quantize_mxfp8) in the kernel's parameters, runs of 1
// (a plain grid stride); a list (quantize_mxfp8_batch) in device memory, runs of 16
// (header comment).
using OneTensor = OneEntry<BatchEntry, 1>;
using TensorList = EntryList<BatchEntry, 16>;

// Where a tile is in the tile sequence: entry e, member g, tile row rt, tile column ct.
struct Cursor {
  int e;
  std::uint32_t g, rt, ct;
};

// The cursor of tile t, whose entry is `from` or a later one.
template <class Table>
__device__ __forceinline__ Cursor cursor_at(const Table& table, std::int64_t t, int from) {
  Cursor c;
  c.e = table.find(t, from);
  const BatchEntry& en = table[c.e];
  // A tensor has fewer than 2^31 tiles (make_batch_entry checks).
  const std::uint32_t local = static_cast<std::uint32_t>(t - en.first_tile);
  c.g = en.member_div.divide(local);
  const std::uint32_t in_member = local - c.g * en.member_tiles;
  c.rt = en.col_div.divide(in_member);
  c.ct = in_member - c.rt * en.col_tiles;
  return c;
}

using tile::Spot;

// Valid columns of a tile (capped at 128), and of the thread's chunks: [0, hi0) of
// chunk 0 and [0, hi1) of chunk 1, 0 outside the member.
struct Room {
  int tile, hi0, hi1;
};
template <bool kFull>
__device__ __forceinline__ Room room_of(const Spot& s) {
  if constexpr (kFull) return Room{kTileCols, 8, 8};
  const int tile = min(s.cols_left, kTileCols);
  const int first = (threadIdx.x & 7) * 8;  // chunk 0's first column in the tile
  return Room{tile, s.row_ok ? min(max(tile - first, 0), 8) : 0, s.row_ok ? min(max(tile - 64 - first, 0), 8) : 0};
}

__device__ __forceinline__ Spot spot_of(const BatchEntry& t, const Cursor& c) {
  const std::int64_t rows = t.shape.rows, cols = t.shape.cols;
  std::int64_t elem_base, srow_base, scol_base;
  if (t.members != nullptr) {
    const Mxfp8Member m = in_global(t.members)[c.g];
    elem_base = m.element_offset;
    srow_base = m.scale_row_offset;
    scol_base = m.scale_col_offset;
  } else {
    const std::int64_t g = c.g;
    elem_base = g * rows * cols;
    srow_base = g * rows * t.row_blocks;
    scol_base = g * t.col_blocks * cols;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = lane & 7;
  const std::int64_t r = static_cast<std::int64_t>(c.rt) * kTileRows + warp * 4 + (lane >> 3);
  const std::int64_t tile_col = static_cast<std::int64_t>(c.ct) * kTileCols;
  Spot s;
  s.elem = elem_base + r * cols + tile_col + q * 8;
  s.row_scale = srow_base + r * t.row_blocks + static_cast<std::int64_t>(c.ct) * 4 + (q >> 2);
  s.col_scale = scol_base + static_cast<std::int64_t>(c.rt) * cols + tile_col;
  s.cols_left = static_cast<int>(cols - tile_col);  // cols < 2^31: make_batch_entry checks
  s.row_ok = r < rows;
  s.full = c.rt < t.full_row_tiles && c.ct < t.full_col_tiles && (elem_base & 7) == 0;
  return s;
}

// c and s moved to tile `next`: one tile to the right when next follows c along its tile
// row (a few additions: the common case), else a fresh start (cursor_at, spot_of) - at
// the start of a run (`run_starts`), or at the next tile row, member or tensor.
template <class Table>
__device__ __forceinline__ void step(const Table& table, Cursor& c, Spot& s, std::int64_t next, bool run_starts) {
  if (!run_starts) {
    const BatchEntry& en = table[c.e];
    if (c.ct + 1 < en.col_tiles) {
      ++c.ct;
      s.next_column();
      s.full = s.full && c.ct < en.full_col_tiles;
      return;
    }
  }
  c = cursor_at(table, next, c.e);
  s = spot_of(table[c.e], c);
}

// 8 bf16 of a chunk as 4 pairs (zero past hi).
template <bool kFull>
__device__ __forceinline__ void load_chunk(const std::uint16_t* p, int hi, std::uint32_t* w) {
  if (kFull || (hi == 8 && aligned16(p))) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    return;
  }
  if constexpr (!kFull) {  // (no such loop in the whole-chunk instance: it returns above)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::uint32_t x0 = 2 * k < hi ? p[2 * k] : 0u;
      const std::uint32_t x1 = 2 * k + 1 < hi ? p[2 * k + 1] : 0u;
      w[k] = x0 | (x1 << 16);
    }
  }
}

__device__ __forceinline__ void load_words(const std::uint16_t* src, const Spot& s, std::uint32_t (&w)[8]) {
  if (s.full) {  // block-uniform
    load_chunk<true>(src + s.elem, 8, w);
    load_chunk<true>(src + s.elem + 64, 8, w + 4);
    return;
  }
  const Room room = room_of<false>(s);
  load_chunk<false>(src + s.elem, room.hi0, w);
  load_chunk<false>(src + s.elem + 64, room.hi1, w + 4);
}

// Shared column data of a tile. col_inv is padded (column c at c + 4 * (c / 32)) so that
// the 8 lanes of a row reading their chunks' 16-byte groups hit 8 different bank groups.
inline constexpr int kInvPad = kTileCols + kTileCols / 8;
__device__ __forceinline__ int inv_slot(int c) { return c + 4 * (c >> 5); }

struct TileShared {
  std::uint32_t col_partial[kWarps][kTileCols / 2];  // per warp: column amaxes, two per word
  float col_inv[kInvPad];                            // 2^-e of each column's scale (padded)
  std::uint8_t col_scale[kTileCols];                 // each column's scale byte
};

// The 8 elements of a chunk (words w[0..3]) in both planes, 4 bytes a word: rowwise with
// the chunk's block multiplier `inv_row`, columnwise with one multiplier per column.
// NaN blocks get 0x7F when the tile has a NaN anywhere (`any_nan`, rare).
__device__ __forceinline__ void encode_chunk(const std::uint32_t* w, float inv_row, std::uint8_t row_scale,
                                             const float4& ic0, const float4& ic1, const uint2& cs, bool any_nan,
                                             std::uint32_t (&qr)[2], std::uint32_t (&qc)[2]) {
  qr[0] = encode_pair(w[0], inv_row, inv_row) | (encode_pair(w[1], inv_row, inv_row) << 16);
  qr[1] = encode_pair(w[2], inv_row, inv_row) | (encode_pair(w[3], inv_row, inv_row) << 16);
  qc[0] = encode_pair(w[0], ic0.x, ic0.y) | (encode_pair(w[1], ic0.z, ic0.w) << 16);
  qc[1] = encode_pair(w[2], ic1.x, ic1.y) | (encode_pair(w[3], ic1.z, ic1.w) << 16);
  if (any_nan) {
    const std::uint32_t row_scales = 0x01010101u * row_scale;
    qr[0] = nan_blocks(qr[0], row_scales);
    qr[1] = nan_blocks(qr[1], row_scales);
    qc[0] = nan_blocks(qc[0], cs.x);
    qc[1] = nan_blocks(qc[1], cs.y);
  }
}

// Stores the first `hi` bytes of a chunk's 8 (one 8-byte store when whole and aligned).
template <bool kFull>
__device__ __forceinline__ void store_chunk(std::uint8_t* dst, const std::uint32_t (&q)[2], int hi) {
  if (kFull || (hi == 8 && (reinterpret_cast<std::uintptr_t>(dst) & 7u) == 0)) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(q[0], q[1]);
    return;
  }
  if constexpr (!kFull) {  // (as in load_chunk)
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < hi) dst[k] = static_cast<std::uint8_t>(q[k / 4] >> (8 * (k % 4)));
  }
}

// Quantizes one tile whose values this thread holds in `w`. Every thread of the block
// calls it (two barriers). Shared memory reuse across calls is safe: col_partial is read
// only between the two barriers, col_inv / col_scale only after the second, and a
// thread's next write of each comes after a barrier that follows all those reads.
template <bool kFull>
__device__ __forceinline__ void quantize_tile(const BatchEntry& t, const Spot& s, const std::uint32_t (&w)[8],
                                              TileShared& sh) {
  const int lane = threadIdx.x & 31, q = lane & 7;
  const Room room = room_of<kFull>(s);

  // Rowwise amaxes of the thread's two blocks, columnwise partials of the warp.
  const std::uint32_t row_max = tile::tile_amaxes(w, sh.col_partial);
  __syncthreads();
  const std::uint32_t amax0 = row_max & 0xFFFFu, amax1 = row_max >> 16;
  bool nan = amax0 > 0x7F80u || amax1 > 0x7F80u;
  if (threadIdx.x < kTileCols / 2) {
    const int j = threadIdx.x;  // tile columns 2j and 2j + 1
    const std::uint32_t v = tile::column_amax_pair(sh.col_partial, j);
    const std::uint32_t amax_lo = v & 0xFFFFu, amax_hi = v >> 16;
    nan = nan || amax_lo > 0x7F80u || amax_hi > 0x7F80u;
    const std::uint8_t s_lo = scale_from_magnitude(amax_lo), s_hi = scale_from_magnitude(amax_hi);
    std::uint8_t* scale_col = in_global(t.out.scale_col) + s.col_scale + 2 * j;
    if (2 * j < room.tile) scale_col[0] = s_lo;
    if (2 * j + 1 < room.tile) scale_col[1] = s_hi;
    *reinterpret_cast<std::uint16_t*>(&sh.col_scale[2 * j]) = static_cast<std::uint16_t>(s_lo | (s_hi << 8));
    *reinterpret_cast<float2*>(&sh.col_inv[inv_slot(2 * j)]) = make_float2(inverse_scale(s_lo), inverse_scale(s_hi));
  }
  const std::uint8_t rs0 = scale_from_magnitude(amax0), rs1 = scale_from_magnitude(amax1);
  if ((q & 3) == 0) {  // one lane of each block writes its scale
    std::uint8_t* scale_row = in_global(t.out.scale_row) + s.row_scale;
    if (room.hi0 > 0) scale_row[0] = rs0;
    if (room.hi1 > 0) scale_row[2] = rs1;
  }
  const bool any_nan = __syncthreads_or(nan) != 0;

  // Chunk h: columns 64h + 8q of the tile, row scale rs_h.
  std::uint8_t* data_row = in_global(t.out.data_row) + s.elem;
  std::uint8_t* data_col = in_global(t.out.data_col) + s.elem;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int hi = h == 0 ? room.hi0 : room.hi1;
    if (hi == 0) return;  // (chunk 1 has columns only when chunk 0 is whole)
    const int col = 64 * h + 8 * q;
    const std::uint8_t rs = h == 0 ? rs0 : rs1;
    const uint2 cs = *reinterpret_cast<const uint2*>(&sh.col_scale[col]);
    const float4* ic = reinterpret_cast<const float4*>(&sh.col_inv[inv_slot(col)]);
    std::uint32_t qr[2], qc[2];
    encode_chunk(w + 4 * h, inverse_scale(rs), rs, ic[0], ic[1], cs, any_nan, qr, qc);
    store_chunk<kFull>(data_row + 64 * h, qr, hi);
    store_chunk<kFull>(data_col + 64 * h, qc, hi);
  }
}

// Before the wait of a dependent launch: the source lines of tile t into L2
// (kernels::prefetch_l2, which reads nothing), for one tensor whose entry is in the
// kernel's parameters and has no member table (so finding the tile reads no global
// memory), when the tile is whole; one lane of the 8 that load a row's 128 bytes.
template <class Table>
__device__ __forceinline__ void prefetch_tile(const Table& table, std::int64_t t) {
  if constexpr (Table::kInParameters) {
    const BatchEntry& en = table[0];
    if (en.members != nullptr) return;
    const Spot s = spot_of(en, cursor_at(table, t, 0));
    if (s.full && (threadIdx.x & 7) == 0) {
      kernels::prefetch_l2(en.src + s.elem);
      kernels::prefetch_l2(en.src + s.elem + 64);
    }
  }
}

// Block b quantizes its tiles (Walk) of the `tiles` tiles of `table`, loading each tile
// while it quantizes the one before.
template <class Table>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    quantize_kernel(const Table table, const std::int64_t tiles, const int run, const std::int32_t* skip_flag) {
  __shared__ __align__(16) TileShared sh;
  const Walk<Table::kMaxRun> walk(run);
  std::int64_t t = walk.first;
  // A programmatic dependent launch (launch_dependent): nothing of global memory (the
  // flag, the entry table, the source) is read before the previous grid is done; only
  // the first tile's lines are asked into L2 meanwhile.
  if (t < tiles) prefetch_tile(table, t);
  kernels::wait_for_previous_grid();
  kernels::allow_next_grid();
  // The flag's load and the first tile's loads are in flight together; nothing is
  // written before the flag is known.
  const std::int32_t skip = skip_flag != nullptr ? *skip_flag : 0;
  if (t >= tiles) return;
  Cursor c = cursor_at(table, t, 0);
  Spot spot = spot_of(table[c.e], c);
  std::uint32_t w[8];
  load_words(in_global(table[c.e].src), spot, w);
  if (skip != 0) return;  // the whole grid leaves together
  for (;;) {
    const bool run_ends = walk.ends_run(t);
    const std::int64_t next = run_ends ? t + walk.gap : t + 1;
    const bool more = next < tiles;  // the same for the whole block
    Cursor c_next = c;
    Spot spot_next = spot;
    std::uint32_t w_next[8];
    if (more) {
      step(table, c_next, spot_next, next, run_ends);
      load_words(in_global(table[c_next.e].src), spot_next, w_next);
    }
    if (spot.full) {  // block-uniform: no bounds or alignment checks
      quantize_tile<true>(table[c.e], spot, w, sh);
    } else {
      quantize_tile<false>(table[c.e], spot, w, sh);
    }
    if (!more) return;
    t = next;
    c = c_next;
    spot = spot_next;
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = w_next[k];
  }
}

}  // namespace

void launch_quantize(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                     const std::int32_t* skip_flag, const Mxfp8Member* table, Stream stream) {
  const OneTensor one{make_batch_entry(shape, src, out, table, 0)};
  const std::int64_t tiles = one.entry.end_tile;
  const WalkPlan walk = plan_walk(tiles, OneTensor::kMaxRun);
  kernels::launch_dependent(quantize_kernel<OneTensor>, static_cast<unsigned>(walk.grid), kThreads,
                            reinterpret_cast<cudaStream_t>(stream), one, tiles, walk.run, skip_flag);
}

int batch_grid(std::int64_t tiles) { return plan_walk(tiles, TensorList::kMaxRun).grid; }

void launch_quantize_batch(const BatchEntry* entries, int count, std::int64_t tiles, const std::int32_t* skip_flag,
                           Stream stream) {
  const WalkPlan walk = plan_walk(tiles, TensorList::kMaxRun);
  kernels::launch_dependent(quantize_kernel<TensorList>, static_cast<unsigned>(walk.grid), kThreads,
                            reinterpret_cast<cudaStream_t>(stream), TensorList{entries, count}, tiles, walk.run,
                            skip_flag);
}

}  // namespace shardopt::mxfp8

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void mxfp8_batch_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(mxfp8::quantize_kernel<mxfp8::OneTensor>));
  visit(kernel_symbol(mxfp8::quantize_kernel<mxfp8::TensorList>));
}

}  // namespace shardopt::kernels
