// nvfp4.cpp - the NVFP4 entry points of one tensor (shape, whole-tensor quantize,
// dequantize): argument checks, then the CUDA launch or the host twin (enqueued on the
// HostStream so that it joins captures). Shards: nvfp4_shard.cpp; lists: nvfp4_batch.cpp.
#include "shardopt/nvfp4.hpp"

#include <cstdint>
#include <limits>
#include <string>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "kernels/nvfp4/nvfp4_checks.hpp"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

namespace shardopt {

namespace nvfp4 {

void require_ptr(const void* p, const std::string& what) {
  SHARDOPT_REQUIRE(p != nullptr, ErrorCode::InvalidArgument,
                   "NVFP4: " + what + " is null; pass memory of the backend of the right size");
}

void require_scale_planes(const Nvfp4Planes& out) {
  require_ptr(out.scale, "out.scale");
  require_ptr(out.amax, "out.amax");
  require_ptr(out.decode_scale, "out.decode_scale");
}

void require_planes(const Nvfp4Planes& out) {
  require_ptr(out.data, "out.data");
  require_scale_planes(out);
}

QuantizeEntry make_quantize_entry(const Nvfp4Shape& shape, const std::uint16_t* src, const Nvfp4Planes& out,
                                  const QuantizeUnits& first) {
  QuantizeEntry e;
  e.shape = shape;
  e.src = src;
  e.out = out;
  e.tiled = tiled_shape(shape);
  e.vector_src = (reinterpret_cast<std::uintptr_t>(src) & 15u) == 0;
  e.vector_data = (reinterpret_cast<std::uintptr_t>(out.data) & 3u) == 0;
  e.tiles_across = e.tiled ? tiles_across(shape, e.kTileSpan) : 0;
  e.first_chunk = first.chunks;
  e.first_tile = first.tiles;
  e.first_block = first.blocks;
  e.first_byte = first.bytes;
  return e;
}

QuantizeUnits units_after(const QuantizeEntry& e) {
  const Nvfp4Shape& s = e.shape;
  QuantizeUnits u{e.first_chunk + (s.numel() + kAmaxChunk - 1) / kAmaxChunk, e.first_tile, e.first_block,
                  e.first_byte};
  if (e.tiled) {
    u.tiles += s.block_rows() * e.tiles_across;
  } else {
    u.blocks += s.scale_numel();
    u.bytes += s.data_bytes();
  }
  return u;
}

}  // namespace nvfp4

void validate(const Nvfp4Shape& s) {
  std::string dims = "[";
  dims += std::to_string(s.rows);
  dims += " x ";
  dims += std::to_string(s.cols);
  dims += "]";
  SHARDOPT_REQUIRE(s.rows > 0 && s.cols > 0, ErrorCode::InvalidArgument,
                   "NVFP4 shape " + dims + " has a dimension <= 0; rows and cols must be positive");
  SHARDOPT_REQUIRE(s.rows <= std::numeric_limits<std::int64_t>::max() / 8 / s.cols, ErrorCode::InvalidArgument,
                   "NVFP4 shape " + dims + " has too many elements; split the tensor");
}

Nvfp4Shape Nvfp4Shape::of(const Shape& shape) {
  SHARDOPT_REQUIRE(shape.size() >= 2, ErrorCode::InvalidArgument,
                   "NVFP4 needs matrices: a shape of " + std::to_string(shape.size()) +
                       " dimension(s) has fewer than 2; keep 1-D tensors (norm weights, biases) in bf16");
  Nvfp4Shape s;
  s.rows = 1;
  for (std::size_t d = 0; d + 1 < shape.size(); ++d) s.rows *= shape[d];
  s.cols = shape.back();
  validate(s);
  return s;
}

Range nvfp4_shard_bytes(Range range) {
  if (range.size() <= 0) return {range.begin / 2, range.begin / 2};
  return {range.begin / 2, (range.end + 1) / 2};
}

void quantize_nvfp4(const Nvfp4Shape& shape, const std::uint16_t* src, const Nvfp4Planes& out,
                    const std::int32_t* skip_flag, Backend backend, Stream stream) {
  validate(shape);
  nvfp4::require_ptr(src, "the bf16 source");
  nvfp4::require_planes(out);
  const nvfp4::QuantizeEntry entry = nvfp4::make_quantize_entry(shape, src, out, {});
  if (backend == Backend::Host) {
    host_enqueue(stream, [entry, skip_flag] {
      if (skip_flag == nullptr || *skip_flag == 0) nvfp4::host_quantize(&entry, 1);
    });
    return;
  }
  nvfp4::launch_quantize(nullptr, 1, entry, nvfp4::units_after(entry), skip_flag, stream);
}

namespace {

void dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                const float* decode_scale, float* out_f32, std::uint16_t* out_bf16, const std::int32_t* skip_flag,
                Backend backend, Stream stream) {
  validate(shape);
  nvfp4::require_ptr(data, "data");
  nvfp4::require_ptr(scale, "scale");
  nvfp4::require_ptr(decode_scale, "decode_scale");
  nvfp4::require_ptr(out_f32 != nullptr ? static_cast<const void*>(out_f32) : out_bf16, "out");
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] {
      if (skip_flag == nullptr || *skip_flag == 0)
        nvfp4::host_dequantize(shape, data, scale, decode_scale, out_f32, out_bf16);
    });
    return;
  }
  nvfp4::launch_dequantize(shape, data, scale, decode_scale, out_f32, out_bf16, skip_flag, stream);
}

}  // namespace

void dequantize_nvfp4(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                      const float* decode_scale, float* out, Backend backend, Stream stream) {
  dequantize(shape, data, scale, decode_scale, out, nullptr, nullptr, backend, stream);
}

void dequantize_nvfp4(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                      const float* decode_scale, std::uint16_t* out, Backend backend, Stream stream) {
  dequantize(shape, data, scale, decode_scale, nullptr, out, nullptr, backend, stream);
}

void dequantize_nvfp4(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                      const float* decode_scale, std::uint16_t* out, const std::int32_t* skip_flag, Backend backend,
                      Stream stream) {
  dequantize(shape, data, scale, decode_scale, nullptr, out, skip_flag, backend, stream);
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::nvfp4 {
void launch_quantize(const QuantizeEntry*, int, const QuantizeEntry&, const QuantizeUnits&, const std::int32_t*, Stream) { detail::no_cuda("NVFP4"); }
void launch_dequantize(const Nvfp4Shape&, const std::uint8_t*, const std::uint8_t*, const float*, float*, std::uint16_t*, const std::int32_t*, Stream) { detail::no_cuda("NVFP4"); }
void launch_partial_amax(const ShardEntry*, int, const ShardEntry&, const ShardUnits&, Stream) { detail::no_cuda("NVFP4"); }
void launch_quantize_shard(const ShardEntry*, int, const ShardEntry&, const ShardUnits&, Stream) { detail::no_cuda("NVFP4"); }
}  // namespace shardopt::nvfp4
#endif
