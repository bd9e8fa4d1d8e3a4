// mxfp8_shard.cu - the kernels of the sharded MXFP8 path (scheme A and B of
// shardopt/mxfp8.hpp): a rank's fp32 master range of one tensor (the per-tensor calls)
// or of a list of tensors (Mxfp8ShardBatch), each phase in ONE launch.
//
// Work: tiles of 32 x 128 elements of one member (mxfp8_tile.cuh), those of every tile
// row holding an element of the range; the entries' tiles form one sequence, which one
// wave of resident blocks walks in interleaved runs (mxfp8_walk.cuh), as the
// whole-tensor kernel of mxfp8_batch.cu does and for the same reason. Each thread holds
// two chunks of 8 columns of one row, 64 apart (Spot): the 8 lanes of a row read 256
// contiguous bytes of master per chunk and write 64 contiguous bytes of each data
// plane. A block issues the loads of its next tile before it works on the current one.
// Elements outside the range (or the tensor) count as zero.
//
// Phase 1 (Mode::Scales, Mode::Amax): rowwise amax over each chunk, then the 4 lanes of
// the 32-column block (xor 1, 2); columnwise amax over the warp's 4 rows (xor 8, 16) and
// the 8 warps through shared memory (two buffers used in turn: one barrier a tile);
// written as scale bytes or as u32 amaxes, for every block of the tile that lies in the
// tensor. Amaxes are integer maxima of bf16 magnitudes (two per word with __vmaxu2),
// which propagates NaN above Inf above finite values.
// Phase 2 (Mode::Data): no barrier and no shared memory; each thread reads the scale
// bytes of its blocks and writes the data bytes of its elements inside the range, from
// fl32(x * 2^-e) and the hardware's RNE saturating f32x2 -> e4m3x2 conversion (equal to
// the host twin's num::f32_to_e4m3 for every input: test/gpu/test_mxfp8_convert.cu),
// NaN blocks patched to 0x7F.
// Owned pass (Mode::Owned; quantize_mxfp8_shard_owned_batch): phase 1 of every tile,
// and for a tile of a tile row wholly inside the range (owned_row, block-uniform) also
// phase 2 in the same pass: each block of it is the rank's alone, so the scale bytes
// phase 1 writes are final. A thread takes its rowwise scales from its own row amaxes
// and its 16 columns' scale bytes from shared memory, where phase 1's column reduction
// left them (a second barrier a tile), then encodes as Mode::Data does. The tile rows a boundary cuts get their data later from
// Mode::Data over the batch's rest table (quantize_mxfp8_shard_rest_batch).
// Whole tiles (inside the range and the member, every access of the phase aligned:
// Spot::full, block-uniform) take a copy of the path with every check compiled out.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/check.hpp"
#include "kernels/adam/adam_mxfp8.hpp"
#include "kernels/adam/adam_vec.cuh"
#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "kernels/mxfp8/mxfp8_math.cuh"
#include "kernels/mxfp8/mxfp8_tile.cuh"
#include "kernels/mxfp8/mxfp8_walk.cuh"

namespace shardopt::mxfp8 {
namespace {

using tile::kFullMask;
using tile::kThreads;
using tile::kWarps;

enum class Mode {
  Scales,  // phase 1 of scheme A: partial scale bytes
  Amax,    // phase 1 of scheme B: partial u32 amaxes
  Data,    // phase 2: data bytes of the range from combined scales
  Owned,   // phase 1 with the data of whole tile rows (their scales are final)
};

// The entry tables: one tensor's range (the per-tensor calls) in the kernel's
// parameters, runs of up to 4 tiles (rank 1 of 4 of Llama-3.2-1B's matrices, per-tensor
// calls in a graph, H100: R = 1, 4, 16 gave 83.7%, 86.5%, 84.5% of copy bandwidth); a
// batch in device memory, runs of 16 (the whole-tensor batch's).
using OneShard = OneEntry<ShardEntry, 4>;
using ShardList = EntryList<ShardEntry, 16>;

// Where a tile is: entry e, global tile row gtr = g * row_tiles + rt, tile column ct.
struct Cursor {
  int e;
  std::uint32_t gtr, g, rt, ct;
};

template <class Table>
__device__ __forceinline__ Cursor cursor_at(const Table& table, std::int64_t t, int from) {
  Cursor c;
  c.e = table.find(t, from);
  const ShardEntry& en = table[c.e];
  const std::uint32_t local = static_cast<std::uint32_t>(t - en.first_tile);  // < 2^31
  const std::uint32_t row = en.col_div.divide(local);
  c.ct = local - row * en.col_tiles;
  c.gtr = en.first_tile_row + row;
  c.g = en.row_div.divide(c.gtr);
  c.rt = c.gtr - c.g * en.row_tiles;
  return c;
}

using tile::Spot;

template <Mode M>
__device__ __forceinline__ std::uint32_t full_col_tiles(const ShardEntry& en) {
  return M == Mode::Data || M == Mode::Owned ? en.full_col_tiles_data : en.full_col_tiles_scales;
}

// Whether tile row c.gtr lies wholly inside the entry's range (block-uniform).
__device__ __forceinline__ bool owned_row(const ShardEntry& en, const Cursor& c) {
  return c.gtr >= en.full_rows_begin && c.gtr < en.full_rows_end;
}

template <Mode M>
__device__ __forceinline__ Spot spot_of(const ShardEntry& en, const Cursor& c) {
  const std::int64_t rows = en.shape.rows, cols = en.shape.cols;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = lane & 7;
  const std::int64_t r = static_cast<std::int64_t>(c.rt) * kTileRows + warp * 4 + (lane >> 3);
  const std::int64_t global_row = static_cast<std::int64_t>(c.g) * rows + r;
  const std::int64_t tile_col = static_cast<std::int64_t>(c.ct) * kTileCols;
  Spot s;
  s.elem = global_row * cols + tile_col + q * 8;
  s.row_scale = global_row * en.row_blocks + static_cast<std::int64_t>(c.ct) * 4 + (q >> 2);
  s.col_scale = static_cast<std::int64_t>(c.gtr) * cols + tile_col;  // col_blocks == row_tiles
  s.cols_left = static_cast<int>(cols - tile_col);                    // cols < 2^31
  s.row_ok = r < rows;
  s.full = c.gtr >= en.full_rows_begin && c.gtr < en.full_rows_end && c.rt < en.full_row_tiles &&
           c.ct < full_col_tiles<M>(en);
  return s;
}

// c and s moved to tile `next`: one tile to the right when next follows c along its tile
// row (a few additions), else a fresh start (at the start of a run, or at the next tile
// row or entry).
template <Mode M, class Table>
__device__ __forceinline__ void step(const Table& table, Cursor& c, Spot& s, std::int64_t next, bool run_starts) {
  if (!run_starts) {
    const ShardEntry& en = table[c.e];
    if (c.ct + 1 < en.col_tiles) {
      ++c.ct;
      s.next_column();
      s.full = s.full && c.ct < full_col_tiles<M>(en);
      return;
    }
  }
  c = cursor_at(table, next, c.e);
  s = spot_of<M>(table[c.e], c);
}

// The valid elements [lo, hi) of each of the thread's chunks (in the tensor and in the
// range; lo == hi: none) and the columns of the tile inside the tensor (capped at 128).
struct Room {
  int tile;
  int lo[2], hi[2];
};
template <bool kFull>
__device__ __forceinline__ Room room_of(const ShardEntry& en, const Spot& s) {
  if constexpr (kFull) return Room{kTileCols, {0, 0}, {8, 8}};
  Room room;
  room.tile = min(s.cols_left, kTileCols);
  const int first = (threadIdx.x & 7) * 8;  // chunk 0's first column in the tile
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::int64_t e0 = s.elem + 64 * h;
    const int in_tensor = s.row_ok ? min(max(room.tile - 64 * h - first, 0), 8) : 0;
    const int lo = static_cast<int>(min(max(en.range.begin - e0, std::int64_t{0}), std::int64_t{8}));
    const int hi = static_cast<int>(min(max(en.range.end - e0, std::int64_t{0}), std::int64_t{in_tensor}));
    room.lo[h] = lo;
    room.hi[h] = max(hi, lo);
  }
  return room;
}

// The master values of the thread's two chunks (16 floats; zero outside [lo, hi)).
struct Masters {
  float4 v[4];  // chunk h at v[2h], v[2h + 1]
};

// kReadOnly: through the non-coherent path (not in the fused Adam pass, which writes
// masters in the same cache lines).
template <bool kFull, bool kReadOnly = true>
__device__ __forceinline__ void load_masters(const ShardEntry& en, const Spot& s, const Room& room, Masters& m) {
  const float* base = in_global(en.master) + (s.elem - en.range.begin);
  if constexpr (kFull) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4* p = reinterpret_cast<const float4*>(base + 64 * h);
      m.v[2 * h] = kReadOnly ? __ldg(p) : p[0];
      m.v[2 * h + 1] = kReadOnly ? __ldg(p + 1) : p[1];
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float f[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        f[k] = (k >= room.lo[h] && k < room.hi[h]) ? (kReadOnly ? __ldg(base + 64 * h + k) : base[64 * h + k]) : 0.0f;
      m.v[2 * h] = make_float4(f[0], f[1], f[2], f[3]);
      m.v[2 * h + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
  }
}

// Two masters as a bf16 pair (lo in the low half) by the hardware's RNE conversion
// (cvt.rn.bf16x2.f32: one instruction, where master_to_bf16 takes about seven integer
// ones per value). It equals master_to_bf16 for every non-NaN input; a NaN gives the
// canonical 0x7FFF instead of the input's payload, which no output can show: a NaN's
// magnitude only ever reaches the scales as "above Inf" (the NaN scale, the canonical
// NaN amax), and its element lies in a NaN row block and a NaN column block, whose data
// bytes nan_blocks overwrites with 0x7F.
// (Mode::Data keeps the integer form: with the hardware one, ptxas spills 22 bytes of
// its kernel instead of 8.)
template <bool kHardware>
__device__ __forceinline__ std::uint32_t bf16_pair(float lo, float hi) {
  if constexpr (kHardware) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&pair);
  } else {
    return static_cast<std::uint32_t>(master_to_bf16(lo)) | (static_cast<std::uint32_t>(master_to_bf16(hi)) << 16);
  }
}

// The 16 values as bf16 pairs: w[0..3] chunk 0, w[4..7] chunk 1.
template <Mode M>
__device__ __forceinline__ void to_words(const Masters& m, std::uint32_t (&w)[8]) {
  constexpr bool kHardware = M != Mode::Data;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    w[2 * k] = bf16_pair<kHardware>(m.v[k].x, m.v[k].y);
    w[2 * k + 1] = bf16_pair<kHardware>(m.v[k].z, m.v[k].w);
  }
}

// Phase 1 of one tile. Every thread of the block calls it (one barrier). col_partial
// alternates between two buffers (`buf`): a thread writes buffer b of a tile only after
// the barrier of the previous tile, which every thread reaches after its reads of
// buffer b two tiles back. Returns the thread's rowwise amax magnitudes (tile_amaxes).
template <Mode M, bool kFull>
__device__ __forceinline__ std::uint32_t partial_tile(const ShardEntry& en, const Spot& s, const std::uint32_t (&w)[8],
                                             std::uint32_t (*col_partial)[kTileCols / 2],
                                             std::uint8_t* col_scales = nullptr, float* col_inverse = nullptr) {
  const int q = threadIdx.x & 7;
  const Room room = room_of<kFull>(en, s);
  const std::uint32_t row_max = tile::tile_amaxes(w, col_partial);
  __syncthreads();
  if (threadIdx.x < kTileCols / 2) {
    const int j = threadIdx.x;  // tile columns 2j and 2j + 1
    const std::uint32_t v = tile::column_amax_pair(col_partial, j);
    const std::uint32_t amax_lo = v & 0xFFFFu, amax_hi = v >> 16;
    const std::int64_t at = s.col_scale + 2 * j;
    if constexpr (M == Mode::Amax) {
      std::uint32_t* out = in_global(en.amax_col) + at;
      if (2 * j < room.tile) out[0] = amax_bits(amax_lo);
      if (2 * j + 1 < room.tile) out[1] = amax_bits(amax_hi);
    } else {
      std::uint8_t* out = in_global(en.out.scale_col) + at;
      const std::uint8_t lo = scale_from_magnitude(amax_lo), hi = scale_from_magnitude(amax_hi);
      if (2 * j < room.tile) out[0] = lo;
      if (2 * j + 1 < room.tile) out[1] = hi;
      if (col_scales != nullptr) {  // the owned pass: every thread reads its columns' scales here
        *reinterpret_cast<std::uint16_t*>(col_scales + 2 * j) =
            static_cast<std::uint16_t>(lo | (static_cast<std::uint32_t>(hi) << 8));
        *reinterpret_cast<float2*>(col_inverse + 2 * j) = make_float2(inverse_scale(lo), inverse_scale(hi));
      }
    }
  }
  if ((q & 3) == 0 && s.row_ok) {  // one lane of each block writes it: blocks q/4 and q/4 + 2
    const std::uint32_t amax0 = row_max & 0xFFFFu, amax1 = row_max >> 16;
    const int block_col = 8 * q;  // first column of block q/4
    if constexpr (M == Mode::Amax) {
      std::uint32_t* out = in_global(en.amax_row) + s.row_scale;
      if (block_col < room.tile) out[0] = amax_bits(amax0);
      if (block_col + 64 < room.tile) out[2] = amax_bits(amax1);
    } else {
      std::uint8_t* out = in_global(en.out.scale_row) + s.row_scale;
      if (block_col < room.tile) out[0] = scale_from_magnitude(amax0);
      if (block_col + 64 < room.tile) out[2] = scale_from_magnitude(amax1);
    }
  }
  return row_max;
}

// The scale bytes phase 2 needs for the thread's chunks: row scale of each chunk, the 8
// column scales of each chunk (4 per word).
struct Scales {
  std::uint32_t row;     // byte h: chunk h's rowwise scale
  std::uint32_t col[4];  // chunk h's columns at col[2h], col[2h + 1]
};

template <bool kFull>
__device__ __forceinline__ void load_scales(const ShardEntry& en, const Spot& s, const Room& room, Scales& sc) {
  const std::uint8_t* srow = in_global(en.out.scale_row) + s.row_scale;
  const std::uint8_t* scol = in_global(en.out.scale_col) + s.col_scale + (threadIdx.x & 7) * 8;
  if constexpr (kFull) {
    sc.row = __ldg(srow) | (static_cast<std::uint32_t>(__ldg(srow + 2)) << 8);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(scol + 64 * h));
      sc.col[2 * h] = v.x;
      sc.col[2 * h + 1] = v.y;
    }
  } else {
    sc.row = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (room.lo[h] < room.hi[h]) sc.row |= static_cast<std::uint32_t>(__ldg(srow + 2 * h)) << (8 * h);
      std::uint32_t c[2] = {0u, 0u};
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (k >= room.lo[h] && k < room.hi[h]) c[k / 4] |= static_cast<std::uint32_t>(__ldg(scol + 64 * h + k)) << (8 * (k % 4));
      sc.col[2 * h] = c[0];
      sc.col[2 * h + 1] = c[1];
    }
  }
}

// Phase 2 of one tile (no barrier): both planes of the thread's elements in the range.
// The column multipliers 2^-e come from the scale bytes, or (kGiven, the owned pass)
// from `col_inverse`, the tile's 128 multipliers in shared memory.
template <bool kFull, bool kGiven = false>
__device__ __forceinline__ void data_tile(const ShardEntry& en, const Spot& s, const std::uint32_t (&w)[8],
                                          const Scales& sc, const float* col_inverse = nullptr) {
  const Room room = room_of<kFull>(en, s);
  std::uint8_t* data_row = in_global(en.out.data_row) + s.elem;
  std::uint8_t* data_col = in_global(en.out.data_col) + s.elem;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int lo = room.lo[h], hi = room.hi[h];
    if (!kFull && lo >= hi) continue;
    const std::uint8_t rs = static_cast<std::uint8_t>(sc.row >> (8 * h));
    const float inv_row = inverse_scale(rs);
    const std::uint32_t cs0 = sc.col[2 * h], cs1 = sc.col[2 * h + 1];
    float inv[8];
    if constexpr (kGiven) {
      const float4* given = reinterpret_cast<const float4*>(col_inverse + 64 * h + 8 * (threadIdx.x & 7));
      const float4 a = given[0], b = given[1];
      inv[0] = a.x, inv[1] = a.y, inv[2] = a.z, inv[3] = a.w;
      inv[4] = b.x, inv[5] = b.y, inv[6] = b.z, inv[7] = b.w;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) inv[k] = inverse_scale(static_cast<std::uint8_t>((k < 4 ? cs0 : cs1) >> (8 * (k % 4))));
    }
    const std::uint32_t* x = w + 4 * h;
    std::uint32_t qr[2], qc[2];
    qr[0] = encode_pair(x[0], inv_row, inv_row) | (encode_pair(x[1], inv_row, inv_row) << 16);
    qr[1] = encode_pair(x[2], inv_row, inv_row) | (encode_pair(x[3], inv_row, inv_row) << 16);
    qc[0] = encode_pair(x[0], inv[0], inv[1]) | (encode_pair(x[1], inv[2], inv[3]) << 16);
    qc[1] = encode_pair(x[2], inv[4], inv[5]) | (encode_pair(x[3], inv[6], inv[7]) << 16);
    const std::uint32_t row_scales = 0x01010101u * rs;
    qr[0] = nan_blocks(qr[0], row_scales);
    qr[1] = nan_blocks(qr[1], row_scales);
    qc[0] = nan_blocks(qc[0], cs0);
    qc[1] = nan_blocks(qc[1], cs1);
    if constexpr (kFull) {
      *reinterpret_cast<uint2*>(data_row + 64 * h) = make_uint2(qr[0], qr[1]);
      *reinterpret_cast<uint2*>(data_col + 64 * h) = make_uint2(qc[0], qc[1]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (k >= lo && k < hi) {
          data_row[64 * h + k] = static_cast<std::uint8_t>(qr[k / 4] >> (8 * (k % 4)));
          data_col[64 * h + k] = static_cast<std::uint8_t>(qc[k / 4] >> (8 * (k % 4)));
        }
      }
    }
  }
}

// The owned pass over a tile of a whole tile row (every thread of the block calls it):
// every block of the tile lies in the range, so its amax over the rank's elements is
// the block's amax and the scale byte phase 1 writes is final (the other ranks add
// zeros in the Max). Phase 1 of the tile, whose column reduction (threads 0-63, one
// column pair each) also leaves the 128 column scale bytes and their multipliers 2^-e in
// shared memory; after a second barrier each thread reads those of its 16 columns from
// there (per chunk one 8-byte and two 16-byte loads), takes its rowwise scales
// from its own row amaxes, and writes the data as phase 2 would from the same bytes.
// (Reducing the 8 warps' partials in every thread instead costs each thread 16 shared
// loads, 56 maxima and 16 scale conversions a tile, 32 times redundant: that made the
// pass ALU-bound at half the copy bandwidth, 2026-11-27, ncu on H200.)
// `col_scales` and `col_inverse` are one buffer each for all tiles: a thread reads it after a tile's second
// barrier and the next tile writes it only after its first one.
template <bool kFull>
__device__ __forceinline__ void owned_tile(const ShardEntry& en, const Spot& s, const std::uint32_t (&w)[8],
                                           std::uint32_t (*col_partial)[kTileCols / 2], std::uint8_t* col_scales,
                                           float* col_inverse) {
  const std::uint32_t row_max = partial_tile<Mode::Scales, kFull>(en, s, w, col_partial, col_scales, col_inverse);
  const int q = threadIdx.x & 7;
  Scales sc;
  sc.row = static_cast<std::uint32_t>(scale_from_magnitude(row_max & 0xFFFFu)) |
           static_cast<std::uint32_t>(scale_from_magnitude(row_max >> 16)) << 8;
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the chunk's 8 columns 64h + 8q ..
    const uint2 v = *reinterpret_cast<const uint2*>(col_scales + 64 * h + 8 * q);
    sc.col[2 * h] = v.x;
    sc.col[2 * h + 1] = v.y;
  }
  data_tile<kFull, true>(en, s, w, sc, col_inverse);
}

// What a thread loads for a tile ahead of working on it.
template <Mode M>
struct Loads {
  Masters m;
  Scales sc{};  // phase 2 only
  __device__ void load(const ShardEntry& en, const Spot& s) {
    if (s.full) {  // block-uniform
      load<true>(en, s);
    } else {
      load<false>(en, s);
    }
  }
  template <bool kFull>
  __device__ void load(const ShardEntry& en, const Spot& s) {
    const Room room = room_of<kFull>(en, s);
    load_masters<kFull>(en, s, room, m);
    if constexpr (M == Mode::Data) load_scales<kFull>(en, s, room, sc);
  }
};

// Block b works on its tiles (Walk) of the `tiles` tiles of `table`, loading each tile
// while it works on the one before. The tile being worked on is held as bf16 pairs (8
// registers, not 16 floats: the kernel stays within 64 registers without spills).
template <Mode M, class Table>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    shard_kernel(const Table table, const std::int64_t tiles, const int run) {
  __shared__ __align__(16) std::uint32_t col_partial[2][kWarps][kTileCols / 2];  // phase 1
  __shared__ __align__(16) std::uint8_t col_scales[kTileCols];                     // the owned pass
  __shared__ __align__(16) float col_inverse[kTileCols];                           // the owned pass
  const Walk<Table::kMaxRun> walk(run);
  std::int64_t t = walk.first;
  if (t >= tiles) return;
  Cursor c = cursor_at(table, t, 0);
  Spot spot = spot_of<M>(table[c.e], c);
  Loads<M> first;
  first.load(table[c.e], spot);
  std::uint32_t w[8];
  to_words<M>(first.m, w);
  Scales sc = first.sc;
  int buf = 0;
  for (;;) {
    const bool run_ends = walk.ends_run(t);
    const std::int64_t next = run_ends ? t + walk.gap : t + 1;
    const bool more = next < tiles;  // the same for the whole block
    Cursor c_next = c;
    Spot spot_next = spot;
    Loads<M> ahead;
    if (more) {
      step<M>(table, c_next, spot_next, next, run_ends);
      ahead.load(table[c_next.e], spot_next);
    }
    const ShardEntry& en = table[c.e];
    if constexpr (M == Mode::Data) {
      if (spot.full) {
        data_tile<true>(en, spot, w, sc);
      } else {
        data_tile<false>(en, spot, w, sc);
      }
    } else if constexpr (M == Mode::Owned) {
      if (!owned_row(en, c)) {  // block-uniform; a boundary row: phase 1 only
        partial_tile<Mode::Scales, false>(en, spot, w, col_partial[buf]);
      } else if (spot.full) {
        owned_tile<true>(en, spot, w, col_partial[buf], col_scales, col_inverse);
      } else {
        owned_tile<false>(en, spot, w, col_partial[buf], col_scales, col_inverse);
      }
      buf ^= 1;
    } else {
      if (spot.full) {
        partial_tile<M, true>(en, spot, w, col_partial[buf]);
      } else {
        partial_tile<M, false>(en, spot, w, col_partial[buf]);
      }
      buf ^= 1;
    }
    if (!more) return;
    t = next;
    c = c_next;
    spot = spot_next;
    to_words<M>(ahead.m, w);
    sc = ahead.sc;
  }
}

template <Mode M, class Table>
void launch(const Table& table, std::int64_t tiles, Stream stream) {
  if (tiles <= 0) return;
  const WalkPlan walk = plan_walk(tiles, Table::kMaxRun);
  shard_kernel<M, Table><<<static_cast<unsigned>(walk.grid), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      table, tiles, walk.run);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------ the fused Adam pass (adam_mxfp8.hpp)

using kernels::AdamMxfp8Place;

// A batch's entries with each one's Adam place (parallel arrays).
struct AdamOwnedList : ShardList {
  const AdamMxfp8Place* places;
};

// Adam over the thread's two chunks of a tile of an owned row (every element of the
// tile that lies in the tensor lies in the range): gradient, master and moments loaded,
// updated by adam_element (adam_math.cuh, the plain pass's math) and stored (nothing on
// a skipped step: the master as it is), and the new masters left in w as bf16 pairs,
// as to_words<Mode::Owned> makes them from the master the owned pass would read.
// kVec: 16-byte accesses (a whole tile whose Adam arrays are aligned), else element by
// element inside the room (zeros outside, as load_masters gives).
template <class Tr, bool kVec>
__device__ __forceinline__ void adam_tile(const ShardEntry& en, const AdamMxfp8Place& pl,
                                          const kernels::AdamApplyParams& a, const kernels::AdamStepValues& sv,
                                          bool skipped, const Spot& s, std::uint32_t (&w)[8]) {
  const Room room = room_of<kVec>(en, s);
  const std::int64_t local = s.elem - en.range.begin;
  const std::int64_t si = pl.shard_offset + local, bi = pl.buffer_offset + local, mi = si - pl.moment_shift;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float p[8];
    if constexpr (kVec) {
      kernels::load_vec<DType::f32, 8, false>(a.master, si + 64 * h, p);
      if (!skipped) {
        float g[8], m[8], v[8];
        kernels::load_vec<Tr::grad, 8, true>(a.grads, bi + 64 * h, g);
        kernels::load_vec<Tr::moment, 8, false>(a.exp_avg, mi + 64 * h, m);
        kernels::load_vec<Tr::moment, 8, false>(a.exp_avg_sq, mi + 64 * h, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) kernels::adam_element<Tr::decoupled>(a.consts, sv, g[k], p[k], m[k], v[k]);
        kernels::store_vec<DType::f32, 8>(a.master, si + 64 * h, p);
        kernels::store_vec<Tr::moment, 8>(a.exp_avg, mi + 64 * h, m);
        kernels::store_vec<Tr::moment, 8>(a.exp_avg_sq, mi + 64 * h, v);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        p[k] = 0.0f;
        if (k >= room.lo[h] && k < room.hi[h]) {
          const std::int64_t i = 64 * h + k;
          p[k] = skipped ? a.master[si + i] : kernels::adam_scalar<Tr>(a, sv, si + i, bi + i, pl.moment_shift);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) w[4 * h + j] = bf16_pair<true>(p[2 * j], p[2 * j + 1]);
  }
}

// The fused pass: the owned pass's walk over the batch's tiles, where a tile of an owned
// row first runs Adam (adam_tile) and quantizes the new masters from registers
// (owned_tile), and any other tile (a boundary row, whose elements plain Adam updated
// before this launch) writes its partial scales from the master, as the owned pass
// does. No loads ahead of the current tile (the Adam arrays of a tile would not fit the
// 64 registers); resident blocks hide the latency.
template <class Tr>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    adam_owned_kernel(const AdamOwnedList table, const std::int64_t tiles, const int run,
                      const kernels::AdamApplyParams a) {
  __shared__ __align__(16) std::uint32_t col_partial[2][kWarps][kTileCols / 2];
  __shared__ __align__(16) std::uint8_t col_scales[kTileCols];
  __shared__ __align__(16) float col_inverse[kTileCols];
  const Walk<AdamOwnedList::kMaxRun> walk(run);
  std::int64_t t = walk.first;
  if (t >= tiles) return;
  const bool skipped = a.scalars->found_inf != 0;  // a skipped step writes no Adam state
  Cursor c = cursor_at(table, t, 0);
  Spot spot = spot_of<Mode::Owned>(table[c.e], c);
  int buf = 0;
  for (;;) {
    const ShardEntry& en = table[c.e];
    std::uint32_t w[8];
    if (owned_row(en, c)) {  // block-uniform
      const AdamMxfp8Place pl = table.places[c.e];
      const kernels::AdamStepValues sv = kernels::adam_step_values(a, pl.group);
      if (spot.full && pl.vec_ok != 0) {
        adam_tile<Tr, true>(en, pl, a, sv, skipped, spot, w);
      } else {
        adam_tile<Tr, false>(en, pl, a, sv, skipped, spot, w);
      }
      if (spot.full) {
        owned_tile<true>(en, spot, w, col_partial[buf], col_scales, col_inverse);
      } else {
        owned_tile<false>(en, spot, w, col_partial[buf], col_scales, col_inverse);
      }
    } else {
      Masters m;
      if (spot.full) {
        load_masters<true, false>(en, spot, room_of<true>(en, spot), m);
      } else {
        load_masters<false, false>(en, spot, room_of<false>(en, spot), m);
      }
      to_words<Mode::Owned>(m, w);
      partial_tile<Mode::Scales, false>(en, spot, w, col_partial[buf]);
    }
    buf ^= 1;
    const bool run_ends = walk.ends_run(t);
    const std::int64_t next = run_ends ? t + walk.gap : t + 1;
    if (next >= tiles) return;  // the same for the whole block
    step<Mode::Owned>(table, c, spot, next, run_ends);
    t = next;
  }
}

}  // namespace

void launch_partial_scales(const Mxfp8Shape& shape, Range range, const float* master, std::uint8_t* scale_row,
                           std::uint8_t* scale_col, Stream stream) {
  Mxfp8Planes out;
  out.scale_row = scale_row;
  out.scale_col = scale_col;
  const OneShard one{make_shard_entry(shape, range, master, out, 0)};
  launch<Mode::Scales>(one, one.entry.end_tile, stream);
}

void launch_partial_amax(const Mxfp8Shape& shape, Range range, const float* master, std::uint32_t* amax_row,
                         std::uint32_t* amax_col, Stream stream) {
  OneShard one{make_shard_entry(shape, range, master, Mxfp8Planes{}, 0)};
  one.entry.amax_row = amax_row;
  one.entry.amax_col = amax_col;
  launch<Mode::Amax>(one, one.entry.end_tile, stream);
}

void launch_shard_data(const Mxfp8Shape& shape, Range range, const float* master, const std::uint8_t* scale_row,
                       const std::uint8_t* scale_col, std::uint8_t* data_row, std::uint8_t* data_col, Stream stream) {
  Mxfp8Planes out;
  out.scale_row = const_cast<std::uint8_t*>(scale_row);  // read only in this mode
  out.scale_col = const_cast<std::uint8_t*>(scale_col);
  out.data_row = data_row;
  out.data_col = data_col;
  const OneShard one{make_shard_entry(shape, range, master, out, 0)};
  launch<Mode::Data>(one, one.entry.end_tile, stream);
}

int shard_batch_grid(std::int64_t tiles) { return tiles > 0 ? plan_walk(tiles, ShardList::kMaxRun).grid : 0; }

void launch_partial_scales_batch(const ShardEntry* entries, int count, std::int64_t tiles, Stream stream) {
  launch<Mode::Scales>(ShardList{entries, count}, tiles, stream);
}

void launch_shard_data_batch(const ShardEntry* entries, int count, std::int64_t tiles, Stream stream) {
  launch<Mode::Data>(ShardList{entries, count}, tiles, stream);
}

void launch_owned_batch(const ShardEntry* entries, int count, std::int64_t tiles, Stream stream) {
  launch<Mode::Owned>(ShardList{entries, count}, tiles, stream);
}

}  // namespace shardopt::mxfp8

namespace shardopt::kernels {

void launch_adam_mxfp8_owned(const AdamVariant& v, const AdamApplyParams& a, const mxfp8::ShardEntry* entries,
                             const AdamMxfp8Place* places, int count, std::int64_t tiles, Stream stream) {
  if (tiles <= 0) return;
  const mxfp8::WalkPlan walk = mxfp8::plan_walk(tiles, mxfp8::AdamOwnedList::kMaxRun);
  const mxfp8::AdamOwnedList table{{entries, count}, places};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  dispatch_adam_variant(v, [&]<class Tr>() {
    if constexpr (!Tr::write_params)  // MXFP8 shards keep no parameter copy (checked when built)
      mxfp8::adam_owned_kernel<Tr><<<static_cast<unsigned>(walk.grid), mxfp8::tile::kThreads, 0, s>>>(table, tiles,
                                                                                                walk.run, a);
  });
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels

// Every kernel of this file, for load_step_kernels: shard_kernel in each mode with each
// entry table the launches above pass, and the fused Adam pass in each variant without
// parameter output (the ones launch_adam_mxfp8_owned can pick).
#include "kernels/common/kernel_files.hpp"

namespace shardopt::kernels {

void mxfp8_shard_kernels_cuda(const KernelVisitor& visit) {
  using mxfp8::Mode;
  visit(kernel_symbol(mxfp8::shard_kernel<Mode::Scales, mxfp8::OneShard>));
  visit(kernel_symbol(mxfp8::shard_kernel<Mode::Amax, mxfp8::OneShard>));
  visit(kernel_symbol(mxfp8::shard_kernel<Mode::Data, mxfp8::OneShard>));
  visit(kernel_symbol(mxfp8::shard_kernel<Mode::Scales, mxfp8::ShardList>));
  visit(kernel_symbol(mxfp8::shard_kernel<Mode::Data, mxfp8::ShardList>));
  visit(kernel_symbol(mxfp8::shard_kernel<Mode::Owned, mxfp8::ShardList>));
  for (DType grad : {DType::f32, DType::bf16, DType::f16})
    for (DType moment : {DType::f32, DType::bf16})
      for (bool decoupled : {true, false}) {
        const AdamVariant v{grad, moment, DType::f32, false, decoupled};
        dispatch_adam_variant(v, [&]<class Tr>() {
          if constexpr (!Tr::write_params) visit(kernel_symbol(mxfp8::adam_owned_kernel<Tr>));
        });
      }
}

}  // namespace shardopt::kernels
