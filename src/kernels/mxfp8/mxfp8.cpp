// mxfp8.cpp - the MXFP8 entry points: argument checks, then the CUDA launch or the
// host twin (enqueued on the HostStream so that it joins captures).
#include "kernels/mxfp8/mxfp8_shard_calls.hpp"
#include "shardopt/mxfp8.hpp"

#include <limits>
#include <string>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

namespace shardopt {
namespace {

std::string dims(const Mxfp8Shape& s) {
  std::string out = "[";
  out += std::to_string(s.members);
  out += " x ";
  out += std::to_string(s.rows);
  out += " x ";
  out += std::to_string(s.cols);
  return out + "]";
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

void check_range(const Mxfp8Shape& s, Range range) {
  SHARDOPT_REQUIRE(range.begin >= 0 && range.begin <= range.end && range.end <= s.numel(), ErrorCode::OutOfRange,
                   "MXFP8 shard range [" + std::to_string(range.begin) + ", " + std::to_string(range.end) +
                       ") is not inside the tensor's " + std::to_string(s.numel()) +
                       " elements; pass the rank's Segment param_offset and param_offset + length");
}

void require_ptr(const void* p, const char* what) {
  SHARDOPT_REQUIRE(p != nullptr, ErrorCode::InvalidArgument,
                   std::string("MXFP8: ") + what + " is null; pass device memory of the right size");
}

}  // namespace

void validate(const Mxfp8Shape& s) {
  SHARDOPT_REQUIRE(s.members > 0 && s.rows > 0 && s.cols > 0, ErrorCode::InvalidArgument,
                   "MXFP8 shape " + dims(s) + " has a dimension <= 0; members, rows and cols must be positive");
  const std::int64_t lim = std::numeric_limits<std::int64_t>::max() / 8;
  SHARDOPT_REQUIRE(s.rows <= lim / s.cols && s.members <= lim / (s.rows * s.cols), ErrorCode::InvalidArgument,
                   "MXFP8 shape " + dims(s) + " has too many elements");
}

Mxfp8Shape Mxfp8Shape::of(const Shape& shape, std::int64_t members) {
  SHARDOPT_REQUIRE(members >= 1, ErrorCode::InvalidArgument,
                   "MXFP8: member count " + std::to_string(members) + " must be >= 1");
  const std::size_t lead = members > 1 ? 1 : 0;  // the member dimension
  SHARDOPT_REQUIRE(shape.size() >= lead + 2, ErrorCode::InvalidArgument,
                   "MXFP8 needs matrices: shape " + shape_str(shape) +
                       (members > 1 ? " has members of fewer than 2 dimensions" : " has fewer than 2 dimensions") +
                       "; keep 1-D tensors (norm weights, biases) in bf16");
  SHARDOPT_REQUIRE(lead == 0 || shape[0] == members, ErrorCode::InvalidArgument,
                   "MXFP8: shape " + shape_str(shape) + " does not start with the member count " +
                       std::to_string(members));
  Mxfp8Shape s;
  s.members = members;
  s.rows = 1;
  for (std::size_t d = lead; d + 1 < shape.size(); ++d) s.rows *= shape[d];
  s.cols = shape.back();
  validate(s);
  return s;
}

Mxfp8Shape Mxfp8Shape::of(const ParamSpec& spec) {
  const ParamSpec v = validated(spec);
  try {
    return of(v.shape, v.members());
  } catch (const Error& e) {
    throw Error(e.code(), "parameter '" + v.name + "': " + e.what());
  }
}

std::vector<Mxfp8Member> mxfp8_contiguous_members(const Mxfp8Shape& s) {
  validate(s);
  std::vector<Mxfp8Member> out(static_cast<std::size_t>(s.members));
  for (std::int64_t g = 0; g < s.members; ++g)
    out[static_cast<std::size_t>(g)] = {g * s.member_numel(), g * s.rows * s.row_blocks(), g * s.col_blocks() * s.cols};
  return out;
}

void quantize_mxfp8(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                    const std::int32_t* skip_flag, Backend backend, Stream stream, const Mxfp8Member* members) {
  validate(shape);
  require_ptr(src, "the bf16 source");
  require_ptr(out.data_row, "out.data_row");
  require_ptr(out.scale_row, "out.scale_row");
  require_ptr(out.data_col, "out.data_col");
  require_ptr(out.scale_col, "out.scale_col");
  if (backend == Backend::Host) {
    // The flag is read when the work runs (a replay reads its current value).
    host_enqueue(stream, [shape, src, out, skip_flag, members] {
      if (skip_flag != nullptr && *skip_flag != 0) return;
      mxfp8::host_quantize(shape, src, out, members);
    });
    return;
  }
  mxfp8::launch_quantize(shape, src, out, skip_flag, members, stream);
}

void mxfp8_partial_scales(const Mxfp8Shape& shape, Range range, const float* master, std::uint8_t* scale_row,
                          std::uint8_t* scale_col, Backend backend, Stream stream) {
  validate(shape);
  check_range(shape, range);
  if (range.size() > 0) require_ptr(master, "the master shard");
  require_ptr(scale_row, "scale_row");
  require_ptr(scale_col, "scale_col");
  if (backend == Backend::Host) {
    host_enqueue(stream, [shape, range, master, scale_row, scale_col] {
      mxfp8::host_partial_scales(shape, range, master, scale_row, scale_col);
    });
    return;
  }
  fill_zero_async(backend, scale_row, static_cast<std::size_t>(shape.scale_row_numel()), stream);
  fill_zero_async(backend, scale_col, static_cast<std::size_t>(shape.scale_col_numel()), stream);
  mxfp8::launch_partial_scales(shape, range, master, scale_row, scale_col, stream);
}

void quantize_mxfp8_shard_data(const Mxfp8Shape& shape, Range range, const float* master,
                               const std::uint8_t* scale_row, const std::uint8_t* scale_col, std::uint8_t* data_row,
                               std::uint8_t* data_col, Backend backend, Stream stream) {
  validate(shape);
  check_range(shape, range);
  if (range.size() == 0) return;
  require_ptr(master, "the master shard");
  require_ptr(scale_row, "scale_row");
  require_ptr(scale_col, "scale_col");
  require_ptr(data_row, "data_row");
  require_ptr(data_col, "data_col");
  if (backend == Backend::Host) {
    host_enqueue(stream, [shape, range, master, scale_row, scale_col, data_row, data_col] {
      mxfp8::host_shard_data(shape, range, master, scale_row, scale_col, data_row, data_col);
    });
    return;
  }
  mxfp8::launch_shard_data(shape, range, master, scale_row, scale_col, data_row, data_col, stream);
}

void mxfp8_partial_amax(const Mxfp8Shape& shape, Range range, const float* master, std::uint32_t* amax_row,
                        std::uint32_t* amax_col, Backend backend, Stream stream) {
  validate(shape);
  check_range(shape, range);
  if (range.size() > 0) require_ptr(master, "the master shard");
  require_ptr(amax_row, "amax_row");
  require_ptr(amax_col, "amax_col");
  if (backend == Backend::Host) {
    host_enqueue(stream, [shape, range, master, amax_row, amax_col] {
      mxfp8::host_partial_amax(shape, range, master, amax_row, amax_col);
    });
    return;
  }
  fill_zero_async(backend, amax_row, static_cast<std::size_t>(shape.scale_row_numel()) * sizeof(std::uint32_t), stream);
  fill_zero_async(backend, amax_col, static_cast<std::size_t>(shape.scale_col_numel()) * sizeof(std::uint32_t), stream);
  mxfp8::launch_partial_amax(shape, range, master, amax_row, amax_col, stream);
}

void quantize_mxfp8_shard(const Mxfp8Shape& shape, Range range, const float* master, const std::uint32_t* amax_row,
                          const std::uint32_t* amax_col, const Mxfp8Planes& out, Backend backend, Stream stream) {
  validate(shape);
  check_range(shape, range);
  require_ptr(amax_row, "amax_row");
  require_ptr(amax_col, "amax_col");
  require_ptr(out.scale_row, "out.scale_row");
  require_ptr(out.scale_col, "out.scale_col");
  if (backend == Backend::Host) {
    host_enqueue(stream, [shape, amax_row, amax_col, out] {
      mxfp8::host_scales_from_amax(shape, amax_row, amax_col, out.scale_row, out.scale_col);
    });
  } else {
    mxfp8::launch_scales_from_amax(shape, amax_row, amax_col, out.scale_row, out.scale_col, stream);
  }
  quantize_mxfp8_shard_data(shape, range, master, out.scale_row, out.scale_col, out.data_row, out.data_col, backend,
                            stream);
}

void dequantize_mxfp8(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data, const std::uint8_t* scale,
                      float* out, Backend backend, Stream stream) {
  validate(shape);
  require_ptr(data, "data");
  require_ptr(scale, "scale");
  require_ptr(out, "out");
  if (backend == Backend::Host) {
    host_enqueue(stream, [shape, plane, data, scale, out] { mxfp8::host_dequantize(shape, plane, data, scale, out); });
    return;
  }
  mxfp8::launch_dequantize(shape, plane, data, scale, out, stream);
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::mxfp8 {
void launch_quantize(const Mxfp8Shape&, const std::uint16_t*, const Mxfp8Planes&, const std::int32_t*, const Mxfp8Member*, Stream) { detail::no_cuda("MXFP8"); }
void launch_partial_scales(const Mxfp8Shape&, Range, const float*, std::uint8_t*, std::uint8_t*, Stream) { detail::no_cuda("MXFP8"); }
void launch_partial_amax(const Mxfp8Shape&, Range, const float*, std::uint32_t*, std::uint32_t*, Stream) { detail::no_cuda("MXFP8"); }
void launch_shard_data(const Mxfp8Shape&, Range, const float*, const std::uint8_t*, const std::uint8_t*, std::uint8_t*, std::uint8_t*, Stream) { detail::no_cuda("MXFP8"); }
void launch_scales_from_amax(const Mxfp8Shape&, const std::uint32_t*, const std::uint32_t*, std::uint8_t*, std::uint8_t*, Stream) { detail::no_cuda("MXFP8"); }
void launch_dequantize(const Mxfp8Shape&, Mxfp8Plane, const std::uint8_t*, const std::uint8_t*, float*, Stream) { detail::no_cuda("MXFP8"); }
}  // namespace shardopt::mxfp8
#endif
