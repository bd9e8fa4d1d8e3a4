// mxfp8_device.cuh - device-only MXFP8 helpers of the kernels (mxfp8_batch.cu,
// mxfp8_shard.cu), in a header so that test/gpu/test_mxfp8_convert.cu can check them
// against the host twin's element math (mxfp8_math.cuh) for every input.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace shardopt::mxfp8 {

/// Two e4m3 bytes (low element in the low byte) of the two bf16 in `two`, each scaled by
/// its own multiplier: RNE, saturating, of fl32(x * inv) - what encode_element computes
/// on the host with num::f32_to_e4m3 - through the hardware f32x2 -> e4m3x2 conversion.
/// The bf16 must not be NaN (a NaN element makes its block a NaN block; see nan_blocks).
__device__ __forceinline__ std::uint32_t encode_pair(std::uint32_t two, float inv_lo, float inv_hi) {
  const float lo = __fmul_rn(__uint_as_float(two << 16), inv_lo);
  const float hi = __fmul_rn(__uint_as_float(two & 0xFFFF0000u), inv_hi);
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

/// The bytes of `q` replaced by the NaN element 0x7F where the matching byte of `scales`
/// is the NaN scale 0xFF.
__device__ __forceinline__ std::uint32_t nan_blocks(std::uint32_t q, std::uint32_t scales) {
  const std::uint32_t nan = __vcmpeq4(scales, 0xFFFFFFFFu);
  return (q & ~nan) | (0x7F7F7F7Fu & nan);
}

}  // namespace shardopt::mxfp8
