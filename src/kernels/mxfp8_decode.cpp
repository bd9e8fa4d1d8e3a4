// mxfp8_decode.cpp - the bf16-output MXFP8 decode: the entry point (dequantize_mxfp8
// with a std::uint16_t output: argument checks, then the CUDA launch or the host twin
// enqueued on the HostStream) and the host twin itself.
#include "kernels/mxfp8_decode.hpp"

#include <string>

#include "core/check.hpp"
#include "kernels/mxfp8_decode.cuh"
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
}  // namespace mxfp8

void dequantize_mxfp8(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data, const std::uint8_t* scale,
                      std::uint16_t* out, Backend backend, Stream stream) {
  validate(shape);
  for (const auto& [p, what] : {std::pair<const void*, const char*>{data, "data"}, {scale, "scale"}, {out, "out"}})
    SHARDOPT_REQUIRE(p != nullptr, ErrorCode::InvalidArgument,
                     std::string("MXFP8 bf16 decode: ") + what + " is null; pass device memory of the right size");
  if (backend == Backend::Host) {
    host_enqueue(stream,
                 [shape, plane, data, scale, out] { mxfp8::host_dequantize_bf16(shape, plane, data, scale, out); });
    return;
  }
  mxfp8::launch_dequantize_bf16(shape, plane, data, scale, out, stream);
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launch refuses.
namespace shardopt::mxfp8 {
void launch_dequantize_bf16(const Mxfp8Shape&, Mxfp8Plane, const std::uint8_t*, const std::uint8_t*, std::uint16_t*,
                            Stream) {
  detail::no_cuda("MXFP8 bf16 decode");
}
}  // namespace shardopt::mxfp8
#endif
