// moment_q8.cpp - whole 8-bit moment arrays to fp32 and back (checkpoints of
// DType::q8_block moments): the host twins of adam_q8.cu's conversions and the dispatch.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/adam/adam_launch.hpp"
#include "kernels/adam/moment_code.cuh"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

namespace shardopt::kernels {
namespace {

void require_blocks(std::int64_t n) {
  SHARDOPT_REQUIRE(n >= 0 && n % kMomentBlock == 0, ErrorCode::Internal,
                   "8-bit moment arrays hold whole blocks of " + std::to_string(kMomentBlock) + " elements; got " +
                       std::to_string(n));
}

void host_decode(const std::uint8_t* codes, const float* scales, float* out, std::int64_t n, bool second) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = scales[i / kMomentBlock];
    out[i] = second ? decode_second_moment(kMomentMaps, codes[i], s)
                    : decode_first_moment(kMomentMaps, codes[i], s);
  }
}

void host_encode(const float* in, std::uint8_t* codes, float* scales, std::int64_t n, bool second) {
  for (std::int64_t b = 0; b < n / kMomentBlock; ++b) {
    float x[kMomentBlock];
    float mx = 0.0f;
    for (std::int64_t i = 0; i < kMomentBlock; ++i) {
      const float v = in[b * kMomentBlock + i];
      x[i] = second ? std::sqrt(v) : v;
      mx = std::fmax(mx, second ? x[i] : std::fabs(x[i]));
    }
    for (std::int64_t i = 0; i < kMomentBlock; ++i)
      codes[b * kMomentBlock + i] = second ? encode_second_moment(kMomentMaps, x[i], mx)
                                           : encode_first_moment(kMomentMaps, x[i], mx);
    scales[b] = mx;
  }
}

}  // namespace

void q8_decode(const std::uint8_t* codes, const float* scales, float* out, std::int64_t n, bool second,
               Backend backend, Stream stream) {
  require_blocks(n);
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] { host_decode(codes, scales, out, n, second); });
    return;
  }
  launch_q8_decode(codes, scales, out, n, second, stream);
}

void q8_encode(const float* in, std::uint8_t* codes, float* scales, std::int64_t n, bool second, Backend backend,
               Stream stream) {
  require_blocks(n);
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] { host_encode(in, codes, scales, n, second); });
    return;
  }
  launch_q8_encode(in, codes, scales, n, second, stream);
}

}  // namespace shardopt::kernels

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::kernels {
void launch_adam_q8_apply(const AdamVariant&, const AdamApplyParams&, Stream) { detail::no_cuda("fused Adam (8-bit moments)"); }
void launch_q8_decode(const std::uint8_t*, const float*, float*, std::int64_t, bool, Stream) {
  detail::no_cuda("8-bit moment decode");
}
void launch_q8_encode(const float*, std::uint8_t*, float*, std::int64_t, bool, Stream) {
  detail::no_cuda("8-bit moment encode");
}
}  // namespace shardopt::kernels
#endif
