// mxfp8_decode.cpp - the bf16-output MXFP8 decode: the entry point (dequantize_mxfp8
// with a std::uint16_t output: argument checks, then the CUDA launch or the host twin
// enqueued on the HostStream), its batched form (dequantize_mxfp8_batch: one launch per
// kMxfp8DecodeLaunch tensors) and the host twins.
#include "kernels/mxfp8/mxfp8_decode.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "kernels/mxfp8/mxfp8_decode.cuh"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

namespace shardopt {

namespace mxfp8 {
void host_dequantize_bf16(const Mxfp8Shape& s, Mxfp8Plane plane, const std::uint8_t* data, const std::uint8_t* scale,
                          std::uint16_t* out) {
  const PlaneIndex index{s.rows, s.cols, plane == Mxfp8Plane::Rowwise};
  for (std::int64_t e = 0; e < s.numel(); ++e) out[e] = decode_element_bf16(data[e], scale[index.scale_of(e)]);
}

void host_dequantize_bf16_list(const Mxfp8Decode* tensors, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const Mxfp8Decode& t = tensors[i];
    host_dequantize_bf16(t.shape, t.plane, t.data, t.scale, t.out);
  }
}

DecodeEntry make_decode_entry(const Mxfp8Decode& t, std::int64_t first_group) {
  const auto aligned = [](const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; };
  const Mxfp8Shape& s = t.shape;
  const std::int64_t lim = std::numeric_limits<std::int32_t>::max();
  DecodeEntry e;
  e.tensor = t;
  e.first_group = first_group;
  e.vector = s.cols % 8 == 0 && aligned(t.data, 8) && aligned(t.out, 16) &&
             (t.plane == Mxfp8Plane::Rowwise || aligned(t.scale, 8)) && s.numel() / 8 <= lim &&
             s.members * s.rows <= lim;
  if (e.vector) {
    e.group_div = make_divider(static_cast<std::uint32_t>(s.cols / 8));
    e.member_div = make_divider(static_cast<std::uint32_t>(s.rows));
  }
  return e;
}

std::int64_t decode_groups(const DecodeEntry& e) { return (e.tensor.shape.numel() + 7) / 8; }
}  // namespace mxfp8

namespace {
void require_decode_ptrs(const void* data, const void* scale, const void* out, const std::string& who) {
  for (const auto& [p, what] : {std::pair<const void*, const char*>{data, "data"}, {scale, "scale"}, {out, "out"}})
    SHARDOPT_REQUIRE(p != nullptr, ErrorCode::InvalidArgument,
                     who + what + " is null; pass device memory of the right size");
}
}  // namespace

void dequantize_mxfp8(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data, const std::uint8_t* scale,
                      std::uint16_t* out, Backend backend, Stream stream) {
  validate(shape);
  require_decode_ptrs(data, scale, out, "MXFP8 bf16 decode: ");
  if (backend == Backend::Host) {
    host_enqueue(stream,
                 [shape, plane, data, scale, out] { mxfp8::host_dequantize_bf16(shape, plane, data, scale, out); });
    return;
  }
  mxfp8::launch_dequantize_bf16(shape, plane, data, scale, out, stream);
}

void dequantize_mxfp8_batch(const std::vector<Mxfp8Decode>& tensors, Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(!tensors.empty(), ErrorCode::InvalidArgument,
                   "dequantize_mxfp8_batch of an empty tensor list; give it at least one tensor to decode");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Mxfp8Decode& t = tensors[i];
    const std::string which = "dequantize_mxfp8_batch tensor " + std::to_string(i) + ": ";
    try {
      validate(t.shape);
    } catch (const Error& e) {
      throw Error(e.code(), which + e.what());
    }
    require_decode_ptrs(t.data, t.scale, t.out, which);
  }
  if (backend == Backend::Host) {
    host_enqueue(stream, [tensors] { mxfp8::host_dequantize_bf16_list(tensors.data(), tensors.size()); });
    return;
  }
  for (std::size_t first = 0; first < tensors.size(); first += kMxfp8DecodeLaunch) {
    mxfp8::DecodeList list;
    const std::size_t n = std::min(kMxfp8DecodeLaunch, tensors.size() - first);
    for (std::size_t k = 0; k < n; ++k) {
      list.entries[k] = mxfp8::make_decode_entry(tensors[first + k], list.groups);
      list.groups += mxfp8::decode_groups(list.entries[k]);
    }
    list.count = static_cast<int>(n);
    mxfp8::launch_dequantize_bf16_list(list, stream);
  }
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launch refuses.
namespace shardopt::mxfp8 {
void launch_dequantize_bf16(const Mxfp8Shape&, Mxfp8Plane, const std::uint8_t*, const std::uint8_t*, std::uint16_t*,
                            Stream) {
  detail::no_cuda("MXFP8 bf16 decode");
}
void launch_dequantize_bf16_list(const DecodeList&, Stream) { detail::no_cuda("MXFP8 bf16 decode"); }
}  // namespace shardopt::mxfp8
#endif
