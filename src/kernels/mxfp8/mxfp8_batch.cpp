// mxfp8_batch.cpp - multi-tensor MXFP8 quantization: the Mxfp8Batch table (checks,
// upload) and quantize_mxfp8_batch (the CUDA launch or the host twin, enqueued on the
// HostStream so that it joins captures).
#include <cstdint>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "kernels/common/entry_table.hpp"
#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt_config.h"

namespace shardopt {

namespace mxfp8 {

BatchEntry make_batch_entry(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                            const Mxfp8Member* members, std::int64_t first_tile) {
  const std::int64_t row_tiles = (shape.rows + kTileRows - 1) / kTileRows;
  const std::int64_t col_tiles = (shape.cols + kTileCols - 1) / kTileCols;
  const std::int64_t member_tiles = row_tiles * col_tiles;
  SHARDOPT_REQUIRE(member_tiles <= 0x7FFFFFFF / shape.members, ErrorCode::InvalidArgument,
                   "MXFP8 tensor of more than 2^31 - 1 tiles of 32 x 128 elements; split it into smaller tensors");
  SHARDOPT_REQUIRE(shape.cols <= 0x7FFFFFFF, ErrorCode::InvalidArgument,
                   "MXFP8 tensor of more than 2^31 - 1 columns; reshape it with fewer columns per row");
  BatchEntry e;
  e.shape = shape;
  e.src = src;
  e.out = out;
  e.members = members;
  e.first_tile = first_tile;
  e.end_tile = first_tile + shape.members * member_tiles;
  e.row_blocks = shape.row_blocks();
  e.col_blocks = shape.col_blocks();
  e.col_tiles = static_cast<std::uint32_t>(col_tiles);
  e.row_tiles = static_cast<std::uint32_t>(row_tiles);
  e.member_tiles = static_cast<std::uint32_t>(member_tiles);
  e.col_div = make_divider(e.col_tiles);
  e.member_div = make_divider(e.member_tiles);
  // Every row starts 16-byte aligned in the source and 8-byte aligned in the data
  // planes when the bases are and cols is a multiple of 8 (member bases: the kernel
  // checks each member's offset).
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const bool aligned = shape.cols % 8 == 0 && address(src) % 16 == 0 && address(out.data_row) % 8 == 0 &&
                       address(out.data_col) % 8 == 0;
  e.full_row_tiles = static_cast<std::uint32_t>(shape.rows / kTileRows);
  e.full_col_tiles = aligned ? static_cast<std::uint32_t>(shape.cols / kTileCols) : 0u;
  return e;
}

}  // namespace mxfp8

struct Mxfp8Batch::Impl {
  detail::EntryTable table;  // the BatchEntry of every tensor, in order
  std::int64_t numel = 0;
  std::int64_t tiles = 0;
  int grid = 0;  // CUDA: blocks of the launch
};

namespace {

void require_ptr(const void* p, std::size_t i, const char* what) {
  SHARDOPT_REQUIRE(p != nullptr, ErrorCode::InvalidArgument,
                   "Mxfp8Batch tensor " + std::to_string(i) + ": " + what +
                       " is null; pass device memory of the right size");
}

constexpr const char* kType = "Mxfp8Batch";

// The batch's state (detail::live_batch: a moved-from batch has none).
template <class ImplPtr>
const auto& live(const ImplPtr& impl) { return detail::live_batch(impl, kType); }

}  // namespace

Mxfp8Batch::Mxfp8Batch(const std::vector<Mxfp8Tensor>& tensors, Backend backend) : impl_(std::make_unique<Impl>()) {
  SHARDOPT_REQUIRE(!tensors.empty(), ErrorCode::InvalidArgument,
                   "Mxfp8Batch of an empty tensor list; give it at least one tensor to quantize");
  SHARDOPT_REQUIRE(tensors.size() <= 0x7FFFFFFF, ErrorCode::InvalidArgument,
                   "Mxfp8Batch of more than 2^31 - 1 tensors; split the list into several batches");
  if (backend == Backend::Cuda && !cuda_compiled()) detail::no_cuda("Mxfp8Batch");
  std::vector<mxfp8::BatchEntry> entries;
  entries.reserve(tensors.size());
  std::int64_t tiles = 0, numel = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Mxfp8Tensor& t = tensors[i];
    try {
      validate(t.shape);
      entries.push_back(mxfp8::make_batch_entry(t.shape, t.src, t.out, t.members, tiles));
    } catch (const Error& e) {
      throw Error(e.code(), "Mxfp8Batch tensor " + std::to_string(i) + ": " + e.what());
    }
    require_ptr(t.src, i, "the bf16 source");
    require_ptr(t.out.data_row, i, "out.data_row");
    require_ptr(t.out.scale_row, i, "out.scale_row");
    require_ptr(t.out.data_col, i, "out.data_col");
    require_ptr(t.out.scale_col, i, "out.scale_col");
    tiles = entries.back().end_tile;
    numel += t.shape.numel();
  }
  Impl& im = *impl_;
  im.numel = numel;
  im.tiles = tiles;
  im.table = detail::EntryTable(backend, entries);
  if (backend == Backend::Cuda) im.grid = mxfp8::batch_grid(tiles);
}

Mxfp8Batch::~Mxfp8Batch() = default;
Mxfp8Batch::Mxfp8Batch(Mxfp8Batch&&) noexcept = default;
Mxfp8Batch& Mxfp8Batch::operator=(Mxfp8Batch&&) noexcept = default;

Backend Mxfp8Batch::backend() const { return live(impl_).table.backend(); }
std::size_t Mxfp8Batch::size() const { return static_cast<std::size_t>(live(impl_).table.count()); }
std::int64_t Mxfp8Batch::numel() const { return live(impl_).numel; }
std::int64_t Mxfp8Batch::tiles() const { return live(impl_).tiles; }
int Mxfp8Batch::grid() const { return live(impl_).grid; }

void quantize_mxfp8_batch(const Mxfp8Batch& batch, const std::int32_t* skip_flag, Backend backend, Stream stream) {
  const Mxfp8Batch::Impl& im = live(batch.impl_);
  im.table.require_call(backend, "quantize_mxfp8_batch");
  const auto* entries = im.table.entries<mxfp8::BatchEntry>();
  const int count = im.table.count();
  if (backend == Backend::Host) {
    // The flag and the table are read when the work runs (a replay reads their values then).
    host_enqueue(stream, [entries, count, skip_flag] {
      if (skip_flag != nullptr && *skip_flag != 0) return;
      mxfp8::host_quantize_batch(entries, count);
    });
    return;
  }
  mxfp8::launch_quantize_batch(entries, count, im.tiles, skip_flag, stream);
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::mxfp8 {
int batch_grid(std::int64_t) { detail::no_cuda("MXFP8"); }
void launch_quantize_batch(const BatchEntry*, int, std::int64_t, const std::int32_t*, Stream) { detail::no_cuda("MXFP8"); }
}  // namespace shardopt::mxfp8
#endif
