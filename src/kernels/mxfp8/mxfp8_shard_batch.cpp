// mxfp8_shard_batch.cpp - a rank's sharded MXFP8 quantization over many tensors: the
// ShardEntry of one range (make_shard_entry), the Mxfp8ShardBatch table (checks, scale
// spans, upload) and the two phase calls (the CUDA launches or the host twins, enqueued
// on the HostStream so that they join captures), and the owned / rest split of the same
// work (quantize_mxfp8_shard_owned_batch, quantize_mxfp8_shard_rest_batch).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "kernels/common/entry_table.hpp"
#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "kernels/mxfp8/mxfp8_shard_spans.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt_config.h"

namespace shardopt {

namespace mxfp8 {

ShardEntry make_shard_entry(const Mxfp8Shape& shape, Range range, const float* master, const Mxfp8Planes& out,
                            std::int64_t first_tile) {
  const std::int64_t row_tiles = (shape.rows + kTileRows - 1) / kTileRows;
  const std::int64_t col_tiles = (shape.cols + kTileCols - 1) / kTileCols;
  SHARDOPT_REQUIRE(row_tiles * col_tiles <= 0x7FFFFFFF / shape.members, ErrorCode::InvalidArgument,
                   "MXFP8 tensor of more than 2^31 - 1 tiles of 32 x 128 elements; split it into smaller tensors");
  SHARDOPT_REQUIRE(shape.cols <= 0x7FFFFFFF, ErrorCode::InvalidArgument,
                   "MXFP8 tensor of more than 2^31 - 1 columns; reshape it with fewer columns per row");
  ShardEntry e;
  e.shape = shape;
  e.range = range;
  e.master = master;
  e.out = out;
  e.first_tile = first_tile;
  e.end_tile = first_tile;
  e.row_blocks = shape.row_blocks();
  e.col_tiles = static_cast<std::uint32_t>(col_tiles);
  e.row_tiles = static_cast<std::uint32_t>(row_tiles);
  e.col_div = make_divider(e.col_tiles);
  e.row_div = make_divider(e.row_tiles);
  e.full_row_tiles = static_cast<std::uint32_t>(shape.rows / kTileRows);
  if (range.size() > 0) {
    const std::int64_t cols = shape.cols, rows = shape.rows;
    // Global (member-major) tile row of a global row, and the flat elements [first,
    // end) of a global tile row.
    const auto tile_row = [&](std::int64_t global_row) {
      return global_row / rows * row_tiles + global_row % rows / kTileRows;
    };
    const auto first_elem = [&](std::int64_t gtr) {
      return (gtr / row_tiles * rows + gtr % row_tiles * kTileRows) * cols;
    };
    const auto end_elem = [&](std::int64_t gtr) {
      return (gtr / row_tiles * rows + std::min(rows, gtr % row_tiles * kTileRows + kTileRows)) * cols;
    };
    const std::int64_t first = tile_row(range.begin / cols), last = tile_row((range.end - 1) / cols);
    e.first_tile_row = static_cast<std::uint32_t>(first);
    e.end_tile = first_tile + (last - first + 1) * col_tiles;
    const std::int64_t full_begin = first_elem(first) >= range.begin ? first : first + 1;
    const std::int64_t full_end = end_elem(last) <= range.end ? last + 1 : last;
    e.full_rows_begin = static_cast<std::uint32_t>(full_begin);
    e.full_rows_end = static_cast<std::uint32_t>(std::max(full_begin, full_end));
    e.owned_begin = e.owned_end = range.begin;
    if (full_end > full_begin) {
      e.owned_begin = first_elem(full_begin);
      e.owned_end = end_elem(full_end - 1);
    }
  }
  // Element i of a whole tile row sits 16-byte aligned in the master (i - begin) and
  // 8-byte aligned in the data planes and the columnwise scales when the bases are and
  // every row starts so (cols a multiple of 4, 8).
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const bool master_aligned =
      shape.cols % 4 == 0 && (address(master) - 4 * static_cast<std::uintptr_t>(range.begin)) % 16 == 0;
  const bool data_aligned = master_aligned && shape.cols % 8 == 0 && address(out.data_row) % 8 == 0 &&
                            address(out.data_col) % 8 == 0 && address(out.scale_col) % 8 == 0;
  e.full_col_tiles_scales = master_aligned ? static_cast<std::uint32_t>(shape.cols / kTileCols) : 0u;
  e.full_col_tiles_data = data_aligned ? static_cast<std::uint32_t>(shape.cols / kTileCols) : 0u;
  return e;
}

std::int64_t append_rest_entries(const ShardEntry& e, std::int64_t first_tile, std::vector<ShardEntry>& rest) {
  if (e.range.size() == 0) return first_tile;
  const std::int64_t rows = (e.end_tile - e.first_tile) / e.col_tiles;
  const std::int64_t end = e.first_tile_row + rows;  // one past the last tile row of the range
  const auto add = [&](std::int64_t row) {
    ShardEntry r = e;
    r.first_tile_row = static_cast<std::uint32_t>(row);
    r.first_tile = first_tile;
    r.end_tile = first_tile + e.col_tiles;
    first_tile = r.end_tile;
    rest.push_back(r);
  };
  // The rows before the whole ones ([first, full_rows_begin): none or one) and after
  // them ([full_rows_end, end): none or one; the range's only row when none is whole).
  for (std::int64_t row = e.first_tile_row; row < e.full_rows_begin; ++row) add(row);
  for (std::int64_t row = e.full_rows_end; row < end; ++row) add(row);
  return first_tile;
}

std::vector<std::pair<std::uint8_t*, std::size_t>> merged_scale_spans(const std::vector<ShardEntry>& entries) {
  std::vector<std::pair<std::uint8_t*, std::size_t>> scales, spans;
  for (const ShardEntry& e : entries) {
    scales.emplace_back(e.out.scale_row, static_cast<std::size_t>(e.shape.scale_row_numel()));
    scales.emplace_back(e.out.scale_col, static_cast<std::size_t>(e.shape.scale_col_numel()));
  }
  std::sort(scales.begin(), scales.end(), [](const auto& a, const auto& b) { return std::less<>{}(a.first, b.first); });
  for (const auto& [p, n] : scales) {
    if (!spans.empty() && spans.back().first + spans.back().second == p) {
      spans.back().second += n;
    } else {
      spans.emplace_back(p, n);
    }
  }
  return spans;
}

}  // namespace mxfp8

struct Mxfp8ShardBatch::Impl {
  detail::EntryTable table;  // the ShardEntry of every tensor, in order
  detail::EntryTable rest;   // the boundary tile rows of every range (append_rest_entries)
  std::int64_t rest_tiles = 0;
  std::int64_t numel = 0;
  std::int64_t tiles = 0;
  std::vector<std::pair<std::uint8_t*, std::size_t>> spans;  // merged scale memory
  int grid = 0;  // CUDA: blocks of each launch
};

namespace {

std::string tensor_str(std::size_t i) { return "Mxfp8ShardBatch tensor " + std::to_string(i); }

void require_ptr(const void* p, std::size_t i, const char* what) {
  SHARDOPT_REQUIRE(p != nullptr, ErrorCode::InvalidArgument,
                   tensor_str(i) + ": " + what + " is null; pass device memory of the right size");
}

using detail::Extent;

constexpr const char* kType = "Mxfp8ShardBatch";

// The batch's state (detail::live_batch: a moved-from batch has none).
template <class ImplPtr>
const auto& live(const ImplPtr& impl) { return detail::live_batch(impl, kType); }

}  // namespace

Mxfp8ShardBatch::Mxfp8ShardBatch(const std::vector<Mxfp8ShardTensor>& tensors, Backend backend)
    : impl_(std::make_unique<Impl>()) {
  SHARDOPT_REQUIRE(!tensors.empty(), ErrorCode::InvalidArgument,
                   "Mxfp8ShardBatch of an empty tensor list; give it at least one tensor");
  SHARDOPT_REQUIRE(tensors.size() <= 0x7FFFFFFF, ErrorCode::InvalidArgument,
                   "Mxfp8ShardBatch of more than 2^31 - 1 tensors; split the list into several batches");
  if (backend == Backend::Cuda && !cuda_compiled()) detail::no_cuda("Mxfp8ShardBatch");
  std::vector<mxfp8::ShardEntry> entries;
  entries.reserve(tensors.size());
  std::vector<Extent> scales, written;
  std::int64_t tiles = 0, numel = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Mxfp8ShardTensor& t = tensors[i];
    const Range r = t.range;
    try {
      validate(t.shape);
    } catch (const Error& e) {
      throw Error(e.code(), tensor_str(i) + ": " + e.what());
    }
    SHARDOPT_REQUIRE(r.begin >= 0 && r.begin <= r.end && r.end <= t.shape.numel(), ErrorCode::OutOfRange,
                     tensor_str(i) + ": range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                         ") is not inside the tensor's " + std::to_string(t.shape.numel()) +
                         " elements; pass the rank's Segment param_offset and param_offset + length");
    try {
      entries.push_back(mxfp8::make_shard_entry(t.shape, r, t.master, t.out, tiles));
    } catch (const Error& e) {
      throw Error(e.code(), tensor_str(i) + ": " + e.what());
    }
    require_ptr(t.out.scale_row, i, "out.scale_row");
    require_ptr(t.out.scale_col, i, "out.scale_col");
    if (r.size() > 0) {
      require_ptr(t.master, i, "the master shard");
      require_ptr(t.out.data_row, i, "out.data_row");
      require_ptr(t.out.data_col, i, "out.data_col");
    }
    const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
    const auto row_bytes = static_cast<std::uintptr_t>(t.shape.scale_row_numel());
    const auto col_bytes = static_cast<std::uintptr_t>(t.shape.scale_col_numel());
    scales.push_back(Extent{at(t.out.scale_row), at(t.out.scale_row) + row_bytes, i, "rowwise scales"});
    scales.push_back(Extent{at(t.out.scale_col), at(t.out.scale_col) + col_bytes, i, "columnwise scales"});
    if (r.size() > 0) {
      const auto b = static_cast<std::uintptr_t>(r.begin), e = static_cast<std::uintptr_t>(r.end);
      written.push_back(Extent{at(t.out.data_row) + b, at(t.out.data_row) + e, i, "rowwise data of its range"});
      written.push_back(Extent{at(t.out.data_col) + b, at(t.out.data_col) + e, i, "columnwise data of its range"});
    }
    tiles = entries.back().end_tile;
    numel += r.size();
  }
  written.insert(written.end(), scales.begin(), scales.end());
  detail::require_disjoint(written, kType);

  Impl& im = *impl_;
  im.spans = mxfp8::merged_scale_spans(entries);
  im.numel = numel;
  im.tiles = tiles;
  im.table = detail::EntryTable(backend, entries);
  std::vector<mxfp8::ShardEntry> rest;
  for (const mxfp8::ShardEntry& e : entries) im.rest_tiles = mxfp8::append_rest_entries(e, im.rest_tiles, rest);
  if (!rest.empty()) im.rest = detail::EntryTable(backend, rest);
  if (backend == Backend::Cuda) im.grid = mxfp8::shard_batch_grid(tiles);
}

Mxfp8ShardBatch::~Mxfp8ShardBatch() = default;
Mxfp8ShardBatch::Mxfp8ShardBatch(Mxfp8ShardBatch&&) noexcept = default;
Mxfp8ShardBatch& Mxfp8ShardBatch::operator=(Mxfp8ShardBatch&&) noexcept = default;

Backend Mxfp8ShardBatch::backend() const { return live(impl_).table.backend(); }
std::size_t Mxfp8ShardBatch::size() const { return static_cast<std::size_t>(live(impl_).table.count()); }
std::int64_t Mxfp8ShardBatch::numel() const { return live(impl_).numel; }
std::int64_t Mxfp8ShardBatch::tiles() const { return live(impl_).tiles; }
int Mxfp8ShardBatch::grid() const { return live(impl_).grid; }
std::size_t Mxfp8ShardBatch::scale_spans() const { return live(impl_).spans.size(); }
std::int64_t Mxfp8ShardBatch::rest_tiles() const { return live(impl_).rest_tiles; }

void mxfp8_partial_scales_batch(const Mxfp8ShardBatch& batch, Backend backend, Stream stream) {
  const auto& im = detail::batch_for_call(batch.impl_, kType, backend, "mxfp8_partial_scales_batch");
  const auto* entries = im.table.entries<mxfp8::ShardEntry>();
  const int count = im.table.count();
  if (backend == Backend::Host) {
    // The table and the masters are read when the work runs (a replay reads them then).
    host_enqueue(stream, [entries, count] { mxfp8::host_partial_scales_batch(entries, count); });
    return;
  }
  for (const auto& [p, n] : im.spans) fill_zero_async(backend, p, n, stream);
  mxfp8::launch_partial_scales_batch(entries, count, im.tiles, stream);
}

void quantize_mxfp8_shard_data_batch(const Mxfp8ShardBatch& batch, Backend backend, Stream stream) {
  const auto& im = detail::batch_for_call(batch.impl_, kType, backend, "quantize_mxfp8_shard_data_batch");
  const auto* entries = im.table.entries<mxfp8::ShardEntry>();
  const int count = im.table.count();
  if (backend == Backend::Host) {
    host_enqueue(stream, [entries, count] { mxfp8::host_shard_data_batch(entries, count); });
    return;
  }
  mxfp8::launch_shard_data_batch(entries, count, im.tiles, stream);
}

void quantize_mxfp8_shard_owned_batch(const Mxfp8ShardBatch& batch, Backend backend, Stream stream) {
  const auto& im = detail::batch_for_call(batch.impl_, kType, backend, "quantize_mxfp8_shard_owned_batch");
  const auto* entries = im.table.entries<mxfp8::ShardEntry>();
  const int count = im.table.count();
  if (backend == Backend::Host) {
    host_enqueue(stream, [entries, count] { mxfp8::host_owned_batch(entries, count); });
    return;
  }
  for (const auto& [p, n] : im.spans) fill_zero_async(backend, p, n, stream);
  mxfp8::launch_owned_batch(entries, count, im.tiles, stream);
}

void quantize_mxfp8_shard_rest_batch(const Mxfp8ShardBatch& batch, Backend backend, Stream stream) {
  const auto& im = detail::batch_for_call(batch.impl_, kType, backend, "quantize_mxfp8_shard_rest_batch");
  if (im.rest_tiles == 0) return;  // every tile row whole (one rank): nothing left
  const auto* entries = im.rest.entries<mxfp8::ShardEntry>();
  const int count = im.rest.count();
  if (backend == Backend::Host) {
    host_enqueue(stream, [entries, count] { mxfp8::host_rest_batch(entries, count); });
    return;
  }
  mxfp8::launch_shard_data_batch(entries, count, im.rest_tiles, stream);
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::mxfp8 {
int shard_batch_grid(std::int64_t) { detail::no_cuda("MXFP8"); }
void launch_partial_scales_batch(const ShardEntry*, int, std::int64_t, Stream) { detail::no_cuda("MXFP8"); }
void launch_shard_data_batch(const ShardEntry*, int, std::int64_t, Stream) { detail::no_cuda("MXFP8"); }
void launch_owned_batch(const ShardEntry*, int, std::int64_t, Stream) { detail::no_cuda("MXFP8"); }
}  // namespace shardopt::mxfp8
#endif
