// nvfp4_shard.cpp - the sharded NVFP4 entry points of one tensor (phase 1: partial
// amaxes; phase 2: scales and the shard's data bytes), their argument checks (shared with
// Nvfp4ShardBatch) and the ShardEntry of one range: the checks, then the CUDA launches
// or the host twins (enqueued on the HostStream so that they join captures) over that
// one entry. Lists: nvfp4_shard_batch.cpp.
#include <cstdint>
#include <string>

#include "kernels/nvfp4/nvfp4_checks.hpp"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "kernels/nvfp4/nvfp4_units.cuh"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"

namespace shardopt {

namespace nvfp4 {

void require_shard(const Nvfp4Shape& s, Range range, const float* master, const void* amax) {
  validate(s);
  SHARDOPT_REQUIRE(range.begin >= 0 && range.begin <= range.end && range.end <= s.numel(), ErrorCode::OutOfRange,
                   "NVFP4 shard range [" + std::to_string(range.begin) + ", " + std::to_string(range.end) +
                       ") is not inside the tensor's " + std::to_string(s.numel()) +
                       " elements; pass the rank's param_offset and param_offset + length");
  if (range.size() > 0) require_ptr(master, "the master shard");
  require_ptr(amax, "amax");
}

void require_shard_planes(const Nvfp4Planes& out, Range range) {
  if (range.size() > 0) require_ptr(out.data, "out.data (the first byte of the shard's span)");
  require_scale_planes(out);
}

ShardEntry make_shard_entry(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax,
                            const Nvfp4Planes& out, const ShardUnits& first) {
  ShardEntry e;
  e.shape = shape;
  e.range = range;
  e.master = master;
  e.amax = amax;
  e.out = out;
  e.touched = touched_blocks(shape, range);
  e.tiled = tiled_shape(shape);
  // Alignment of the element / byte at index 0 of the tensor as the kernels address it
  // (master + (i - range.begin), out.data + (k - range.begin / 2)), in integers: no
  // pointer before an allocation is formed.
  const auto begin = static_cast<std::uintptr_t>(range.begin);
  e.vector_master = ((reinterpret_cast<std::uintptr_t>(master) - begin * sizeof(float)) & 15u) == 0;
  e.vector_data = ((reinterpret_cast<std::uintptr_t>(out.data) - begin / 2) & 3u) == 0;
  e.tiles_across = e.tiled ? tiles_across(shape, e.kTileSpan) : 0;
  e.first_block_row = e.touched.begin / shape.block_cols();
  e.first_amax = first.amax;
  e.first_tile = first.tiles;
  e.first_touched = first.touched;
  e.first_block = first.blocks;
  e.first_byte = first.bytes;
  return e;
}

ShardUnits units_after(const ShardEntry& e) {
  ShardUnits u{e.first_amax + e.shape.amax_numel(), e.first_tile, e.first_touched,
               e.first_block + e.shape.scale_numel(), e.first_byte};
  if (e.tiled) {
    u.tiles += e.touched.size() / e.shape.block_cols() * e.tiles_across;
  } else {
    u.touched += e.touched.size();
    u.bytes += nvfp4_shard_bytes(e.range).size();
  }
  return u;
}

}  // namespace nvfp4

void nvfp4_partial_amax(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax,
                        Backend backend, Stream stream) {
  nvfp4::require_shard(shape, range, master, amax);
  const nvfp4::ShardEntry entry = nvfp4::make_shard_entry(shape, range, master, amax, Nvfp4Planes{}, {});
  if (backend == Backend::Host) {
    host_enqueue(stream, [entry] { nvfp4::host_partial_amax(&entry, 1); });
    return;
  }
  nvfp4::launch_partial_amax(nullptr, 1, entry, nvfp4::units_after(entry), stream);
}

void quantize_nvfp4_shard(const Nvfp4Shape& shape, Range range, const float* master, const std::uint32_t* amax,
                          const Nvfp4Planes& out, Backend backend, Stream stream) {
  nvfp4::require_shard(shape, range, master, amax);
  nvfp4::require_shard_planes(out, range);
  // Phase 2 only reads the amax buffer (the entry's pointer is mutable for phase 1).
  const nvfp4::ShardEntry entry =
      nvfp4::make_shard_entry(shape, range, master, const_cast<std::uint32_t*>(amax), out, {});
  if (backend == Backend::Host) {
    host_enqueue(stream, [entry] { nvfp4::host_quantize_shard(&entry, 1); });
    return;
  }
  nvfp4::launch_quantize_shard(nullptr, 1, entry, nvfp4::units_after(entry), stream);
}

}  // namespace shardopt
