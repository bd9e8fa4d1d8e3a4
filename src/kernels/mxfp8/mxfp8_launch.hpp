// mxfp8_launch.hpp - internal: the CUDA launch wrappers (mxfp8*.cu) and the host twins
// (mxfp8_host.cpp) behind the entry points of shardopt/mxfp8.hpp. Arguments are
// validated by the dispatcher (mxfp8.cpp) before they get here.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/fast_divide.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/range.hpp"

namespace shardopt::mxfp8 {

/// Tiles of 32 rows x 128 columns (of one member) are the kernels' unit of work.
inline constexpr int kTileRows = 32;
inline constexpr int kTileCols = 128;

/// One tensor of a whole-tensor quantization as the kernel and the host twin read it:
/// the arguments of a quantize_mxfp8 call and where its tiles sit in the batch's tile
/// sequence. Mxfp8Batch uploads a table of these; quantize_mxfp8 passes one by value.
struct BatchEntry {
  Mxfp8Shape shape;
  const std::uint16_t* src = nullptr;
  Mxfp8Planes out;
  const Mxfp8Member* members = nullptr;  ///< device member table, or null (contiguous)
  std::int64_t first_tile = 0;           ///< index of the tensor's first tile in the batch
  std::int64_t end_tile = 0;             ///< one past its last tile
  std::int64_t row_blocks = 0;           ///< shape.row_blocks()
  std::int64_t col_blocks = 0;           ///< shape.col_blocks()
  std::uint32_t col_tiles = 0;           ///< tiles across a member's columns
  std::uint32_t row_tiles = 0;           ///< tiles down a member's rows
  std::uint32_t member_tiles = 0;        ///< tiles of one member
  FastDivider col_div;                   ///< divides by col_tiles
  FastDivider member_div;                ///< divides by member_tiles
  /// Tile rows and columns of a member whose tiles are whole (rows / 32, cols / 128);
  /// 0 columns when the source or the data planes are not aligned for 16- and 8-byte
  /// accesses on every row (the kernel then checks each access).
  std::uint32_t full_row_tiles = 0;
  std::uint32_t full_col_tiles = 0;
};

/// The entry of one tensor whose first tile is `first_tile`. Throws
/// Error(InvalidArgument) when the tensor has more than 2^31 - 1 tiles (the kernel
/// indexes a tensor's tiles with 32-bit integers). The shape must be valid.
BatchEntry make_batch_entry(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                            const Mxfp8Member* members, std::int64_t first_tile);

/// One tensor of a rank's sharded quantization as the kernels of mxfp8_shard.cu and the
/// host twins read it: the arguments of the per-tensor calls and where the tiles its
/// range touches sit in the batch's tile sequence. The tiles are those of every tile
/// row (member-major: member g's tile row rt is global tile row g * row_tiles + rt)
/// holding an element of the range, across all column tiles. Mxfp8ShardBatch uploads a
/// table of these; the per-tensor calls pass one by value.
struct ShardEntry {
  Mxfp8Shape shape;                     ///< contiguous members
  Range range;                          ///< the rank's flat elements [begin, end)
  const float* master = nullptr;        ///< element i at master[i - range.begin]
  Mxfp8Planes out;                      ///< scales (phase 1 writes, phase 2 reads), data
  std::uint32_t* amax_row = nullptr;    ///< scheme (B) phase 1 writes these instead
  std::uint32_t* amax_col = nullptr;
  std::int64_t first_tile = 0;          ///< index of the entry's first tile in the batch
  std::int64_t end_tile = 0;            ///< one past its last tile
  std::int64_t row_blocks = 0;          ///< shape.row_blocks()
  std::uint32_t col_tiles = 0;          ///< tiles across a member's columns
  std::uint32_t row_tiles = 0;          ///< tile rows of a member (= shape.col_blocks())
  std::uint32_t first_tile_row = 0;     ///< global tile row of range.begin
  FastDivider col_div;                  ///< divides by col_tiles
  FastDivider row_div;                  ///< divides by row_tiles
  /// Whole tiles: global tile rows [full_rows_begin, full_rows_end) lie inside the
  /// range entirely, tile rows below full_row_tiles of a member have 32 rows, and
  /// column tiles below full_col_tiles_{scales,data} have 128 columns and every access
  /// of that phase aligned (0 when some row is not: the kernel then checks each one).
  std::uint32_t full_rows_begin = 0;
  std::uint32_t full_rows_end = 0;
  std::uint32_t full_row_tiles = 0;
  std::uint32_t full_col_tiles_scales = 0;  ///< phase 1: 16-byte master loads
  std::uint32_t full_col_tiles_data = 0;    ///< phase 2: and 8-byte data / scale accesses
  /// The elements of the whole tile rows [full_rows_begin, full_rows_end) (contiguous:
  /// global tile rows follow each other in memory): every block they hold lies inside
  /// the range, so this rank alone knows its amax and the owned pass writes its data
  /// bytes. Empty (both range.begin) when there are none.
  std::int64_t owned_begin = 0;
  std::int64_t owned_end = 0;
};

/// The entry of one tensor's range whose first tile is `first_tile` (amax_row/col
/// stay null). Throws Error(InvalidArgument) when the tensor has more than 2^31 - 1
/// tiles or columns. The shape and the range must be valid.
ShardEntry make_shard_entry(const Mxfp8Shape& shape, Range range, const float* master, const Mxfp8Planes& out,
                            std::int64_t first_tile);

/// The rest entries of `e` (its boundary tile rows: those of its range that are not
/// whole, at most two), appended to `rest` with their tiles numbered from `first_tile`;
/// returns the tile after the last. Each is `e` restricted to one tile row: the owned
/// pass left the data of these rows to the rest pass (phase 2 of them, Mode::Data).
std::int64_t append_rest_entries(const ShardEntry& e, std::int64_t first_tile, std::vector<ShardEntry>& rest);

// ------------------------------------------------------------------ CUDA (mxfp8_batch.cu)

/// Whole-tensor quantize of one tensor; `table` may be null (contiguous members).
void launch_quantize(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                     const std::int32_t* skip_flag, const Mxfp8Member* table, Stream stream);
/// Blocks of the batch kernel's persistent grid (at most one wave of resident blocks)
/// for `tiles` tiles on the current device (host queries only; call it when building
/// a batch).
int batch_grid(std::int64_t tiles);
/// Whole-tensor quantize of the `count` tensors of the device table `entries` (tiles:
/// the last entry's end_tile) with batch_grid(tiles) blocks, in one launch.
void launch_quantize_batch(const BatchEntry* entries, int count, std::int64_t tiles, const std::int32_t* skip_flag,
                           Stream stream);

// ------------------------------------------------------------------ CUDA (mxfp8_shard.cu)

/// Partial scale bytes of the blocks `range` touches (the caller zeroed the scales).
void launch_partial_scales(const Mxfp8Shape& shape, Range range, const float* master,
                           std::uint8_t* scale_row, std::uint8_t* scale_col, Stream stream);
/// Partial u32 amaxes of the blocks `range` touches (the caller zeroed the buffers).
void launch_partial_amax(const Mxfp8Shape& shape, Range range, const float* master,
                         std::uint32_t* amax_row, std::uint32_t* amax_col, Stream stream);
/// Data bytes of the elements of `range` from the combined scales.
void launch_shard_data(const Mxfp8Shape& shape, Range range, const float* master,
                       const std::uint8_t* scale_row, const std::uint8_t* scale_col,
                       std::uint8_t* data_row, std::uint8_t* data_col, Stream stream);
/// Blocks of the sharded kernels' persistent grid for `tiles` tiles of a batch.
int shard_batch_grid(std::int64_t tiles);
/// Phase 1 (partial scales; the caller zeroed the scales) or phase 2 (data) of the
/// `count` entries of the device table `entries` (tiles: the last entry's end_tile), in
/// one launch.
void launch_partial_scales_batch(const ShardEntry* entries, int count, std::int64_t tiles, Stream stream);
void launch_shard_data_batch(const ShardEntry* entries, int count, std::int64_t tiles, Stream stream);
/// The owned pass (the caller zeroed the scales): per tile of the entries, the whole
/// amaxes, scale bytes and data bytes of a tile inside the entry's whole tile rows, or
/// the partial scale bytes of any other tile (phase 1 of scheme A), in one launch.
void launch_owned_batch(const ShardEntry* entries, int count, std::int64_t tiles, Stream stream);

// ------------------------------------------------------------------ CUDA (mxfp8.cu)

/// Scale bytes of every block from combined u32 amaxes.
void launch_scales_from_amax(const Mxfp8Shape& shape, const std::uint32_t* amax_row,
                             const std::uint32_t* amax_col, std::uint8_t* scale_row,
                             std::uint8_t* scale_col, Stream stream);
/// One plane to f32.
void launch_dequantize(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                       const std::uint8_t* scale, float* out, Stream stream);

// ------------------------------------------------------------------ host twins (mxfp8_host.cpp)
// Same results, byte for byte; they run synchronously (the dispatcher enqueues them).

void host_quantize(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                   const Mxfp8Member* table);
/// host_quantize of each of the `count` entries, in order.
void host_quantize_batch(const BatchEntry* entries, int count);
void host_partial_scales(const Mxfp8Shape& shape, Range range, const float* master,
                         std::uint8_t* scale_row, std::uint8_t* scale_col);
void host_partial_amax(const Mxfp8Shape& shape, Range range, const float* master,
                       std::uint32_t* amax_row, std::uint32_t* amax_col);
void host_scales_from_amax(const Mxfp8Shape& shape, const std::uint32_t* amax_row,
                           const std::uint32_t* amax_col, std::uint8_t* scale_row,
                           std::uint8_t* scale_col);
void host_shard_data(const Mxfp8Shape& shape, Range range, const float* master,
                     const std::uint8_t* scale_row, const std::uint8_t* scale_col,
                     std::uint8_t* data_row, std::uint8_t* data_col);
/// host_partial_scales (scales zeroed first) / host_shard_data of each of the `count`
/// entries, in order.
void host_partial_scales_batch(const ShardEntry* entries, int count);
void host_shard_data_batch(const ShardEntry* entries, int count);
/// The owned pass of each entry: host_partial_scales of its range, then
/// host_shard_data of [owned_begin, owned_end).
void host_owned_batch(const ShardEntry* entries, int count);
/// The rest pass over rest entries (append_rest_entries): host_shard_data of each
/// entry's range inside its one tile row.
void host_rest_batch(const ShardEntry* rest, int count);
void host_dequantize(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                     const std::uint8_t* scale, float* out);

}  // namespace shardopt::mxfp8
