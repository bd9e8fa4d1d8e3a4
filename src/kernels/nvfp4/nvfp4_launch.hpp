// nvfp4_launch.hpp - internal: the CUDA launch wrappers (nvfp4*.cu) and the host twins
// (nvfp4_host.cpp) behind the entry points of shardopt/nvfp4.hpp. Arguments are
// validated by the dispatchers (nvfp4*.cpp) before they get here.
#pragma once

#include <cstdint>

#include "shardopt/backend.hpp"
#include "shardopt/nvfp4.hpp"
#include "shardopt/range.hpp"

namespace shardopt::nvfp4 {

/// Elements of a chunk of the whole-tensor amax pass (nvfp4.cu): 256 threads, 8 loads of
/// 8 bf16 each.
inline constexpr std::int64_t kAmaxChunk = 256 * 8 * 8;
/// Tiles of the tiled kernels (nvfp4_tile.cuh): 16 rows (one block row) x 128 * span
/// columns (8 * span blocks), span 2 for whole tensors (QuantizeEntry::kTileSpan), 1 for
/// shards (ShardEntry::kTileSpan); a tensor's tiles across a block row.
inline constexpr int kSpanBlocks = 8;
inline std::int64_t tiles_across(const Nvfp4Shape& s, int span) {
  const std::int64_t blocks = std::int64_t{kSpanBlocks} * span;
  return (s.block_cols() + blocks - 1) / blocks;
}

/// Whether a tensor takes the tiled kernels: cols % 16 == 0, so that every data byte
/// lies in one block and a block's bytes are 16 rows of 8 bytes (else the per-block and
/// per-byte kernels).
inline bool tiled_shape(const Nvfp4Shape& s) { return s.cols % kNvfp4Block == 0; }

/// Counts of the units of whole-tensor entries: amax chunks (every tensor), tiles (tiled
/// tensors), blocks and data bytes (the others: the per-block / per-byte kernels).
struct QuantizeUnits {
  std::int64_t chunks = 0, tiles = 0, blocks = 0, bytes = 0;
};

/// One tensor of a whole-tensor quantization as the kernels and the host twin read it:
/// the arguments of a quantize_nvfp4 call and where its units sit in the batch's
/// sequences. Nvfp4Batch uploads a table of these; quantize_nvfp4 passes one by value.
struct QuantizeEntry {
  static constexpr int kTileSpan = 2;  ///< tiles of 16 x 256 (two 8-element chunks per thread)
  Nvfp4Shape shape;
  const std::uint16_t* src = nullptr;
  Nvfp4Planes out;
  bool tiled = false;            ///< tiled_shape(shape)
  bool vector_src = false;       ///< src is 16-byte aligned (16-byte loads)
  bool vector_data = false;      ///< out.data is 4-byte aligned (4-byte stores; tiled only)
  std::int64_t tiles_across = 0; ///< tiles_across(shape, kTileSpan) (tiled only)
  std::int64_t first_chunk = 0;  ///< index of the tensor's first amax chunk in the batch
  std::int64_t first_tile = 0;   ///< ... first tile (tiled tensors own tiles)
  std::int64_t first_block = 0;  ///< ... first block (the others own blocks and bytes)
  std::int64_t first_byte = 0;   ///< ... first data byte
};

/// The entry of one tensor whose units start at `first`.
QuantizeEntry make_quantize_entry(const Nvfp4Shape& shape, const std::uint16_t* src, const Nvfp4Planes& out,
                                  const QuantizeUnits& first);
/// Where the units of the entry after `e` start (for the last entry: the counts of all).
QuantizeUnits units_after(const QuantizeEntry& e);

/// One tensor of a rank's sharded quantization as the kernels and the host twins read
/// it: the arguments of one nvfp4_partial_amax + quantize_nvfp4_shard pair and where its
/// units sit in the batch's sequences. Nvfp4ShardBatch uploads a table of these; the
/// per-tensor calls pass one by value.
struct ShardEntry {
  static constexpr int kTileSpan = 1;  ///< tiles of 16 x 128 (8 fp32 masters per thread)
  Nvfp4Shape shape;
  Range range;                      ///< the rank's flat elements
  const float* master = nullptr;    ///< element i at master[i - range.begin]
  std::uint32_t* amax = nullptr;    ///< amax_numel() u32 entries (phase 1 writes, phase 2 reads)
  Nvfp4Planes out;                  ///< out.data: the bytes of nvfp4_shard_bytes(range), from its first
  Range touched;                    ///< touched_blocks(shape, range): the blocks phase 1 writes
  bool tiled = false;               ///< tiled_shape(shape): the tiled kernels
  bool vector_master = false;       ///< master - range.begin is 16-byte aligned (16-byte loads)
  bool vector_data = false;         ///< out.data - range.begin / 2 is 4-byte aligned (4-byte stores)
  std::int64_t tiles_across = 0;    ///< tiles_across(shape, kTileSpan) (tiled only)
  std::int64_t first_block_row = 0; ///< the first block row of `touched`
  std::int64_t first_amax = 0;      ///< index of the tensor's first amax entry in the batch
  std::int64_t first_tile = 0;      ///< ... first tile of the touched block rows (tiled tensors)
  std::int64_t first_touched = 0;   ///< ... first touched block (the others)
  std::int64_t first_block = 0;     ///< ... first block
  std::int64_t first_byte = 0;      ///< ... first shard byte (the others)
};

/// Counts of the units of shard entries: amax entries (phase 1 zeroes them), tiles of
/// the touched block rows of tiled tensors (both phases), touched blocks of the others
/// (phase 1), blocks of all (phase 2 scales) and shard bytes of the others (phase 2
/// data).
struct ShardUnits {
  std::int64_t amax = 0, tiles = 0, touched = 0, blocks = 0, bytes = 0;
};

/// The entry of one (checked) tensor whose units start at `first`.
ShardEntry make_shard_entry(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax,
                            const Nvfp4Planes& out, const ShardUnits& first);
/// Where the units of the entry after `e` start (for the last entry: the counts of all).
ShardUnits units_after(const ShardEntry& e);

// ------------------------------------------------------------------ CUDA (nvfp4.cu)

/// Whole-tensor quantize of the `count` entries of the device table `entries`, or of
/// `one` when `entries` is null; `units`: those of all of them. Every kernel returns at
/// once when `skip_flag` (device int32, may be null) is nonzero.
void launch_quantize(const QuantizeEntry* entries, int count, const QuantizeEntry& one, const QuantizeUnits& units,
                     const std::int32_t* skip_flag, Stream stream);
/// The data plane to f32 or to bf16 (out_f32 or out_bf16, the other null); returns at
/// once when `skip_flag` (device int32, may be null) is nonzero. In nvfp4_decode.cu: the
/// batched decode's kernel on a list of one.
void launch_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                       const float* decode_scale, float* out_f32, std::uint16_t* out_bf16,
                       const std::int32_t* skip_flag, Stream stream);

// ------------------------------------------------------------------ CUDA (nvfp4_shard.cu)
// Over the `count` entries of the device table `entries`, or `one` when it is null;
// `units`: those of all of them. Two or three launches each (kernels without units
// are not launched).

/// Phase 1: zero every amax buffer, then the partial amaxes of every range.
void launch_partial_amax(const ShardEntry* entries, int count, const ShardEntry& one, const ShardUnits& units,
                         Stream stream);
/// Phase 2: every scale and the two fp32 values, then the data bytes of every range.
void launch_quantize_shard(const ShardEntry* entries, int count, const ShardEntry& one, const ShardUnits& units,
                           Stream stream);

// ------------------------------------------------------------------ host twins (nvfp4_host.cpp)
// Same results, byte for byte; they run synchronously (the dispatchers enqueue them).

/// host quantize of each of the `count` entries, in order.
void host_quantize(const QuantizeEntry* entries, int count);
/// Phase 1, then phase 2, of each of the `count` entries, in order.
void host_partial_amax(const ShardEntry* entries, int count);
void host_quantize_shard(const ShardEntry* entries, int count);
void host_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                     const float* decode_scale, float* out_f32, std::uint16_t* out_bf16);

}  // namespace shardopt::nvfp4
