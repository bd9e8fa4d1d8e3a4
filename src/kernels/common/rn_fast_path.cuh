// rn_fast_path.cuh - the fast paths of IEEE square root and division (round to nearest),
// without the per-call branch to their slow paths (CUDA device code only).
//
// For sqrtf(x) and a / b the compiler emits an approximation, a correction that makes it
// exact, and a range check with a branch to a slow path for the inputs where that sequence
// could go wrong. The branch ends the compiler's scheduling region at every call, so a
// thread updating several elements runs their arithmetic one element after another. These
// functions are the same fast-path instructions without the branch. Each also reports
// whether its input lies inside a range where that sequence is exact (a range inside the
// one the compiler's own check admits); the caller takes all its elements through the fast
// path, then redoes the ones out of range (none, in practice) with sqrtf and /. The results
// equal sqrtf and / bit for bit (GpuRnFastPath.*, over the whole admitted ranges).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardopt::kernels {

/// The hardware's approximate reciprocal square root and reciprocal (MUFU), as the fast
/// paths of sqrtf and / start from them.
__device__ __forceinline__ float rsqrt_approx(float x) {
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// sqrtf(x) for x zero or in [2^-101, FLT_MAX] (`exact` is false otherwise: negative,
/// subnormal, infinite and NaN x): y = x / sqrt(x) from the approximate reciprocal square
/// root, then one correction by the residual x - y^2. A zero x gives x itself.
__device__ __forceinline__ float sqrt_rn_fast(float x, bool& exact) {
  exact = __float_as_uint(x) - 0x0D000000u <= 0x727FFFFFu || x == 0.0f;  // bits in [2^-101, FLT_MAX]
  const float r = rsqrt_approx(x);
  const float y = __fmul_rn(x, r);
  const float half_r = __fmul_rn(r, 0.5f);
  const float exact_y = __fmaf_rn(__fmaf_rn(-y, y, x), half_r, y);
  return x == 0.0f ? x : exact_y;
}

/// a / b for b in [2^-60, 2^61) and a zero or |a| in [2^-60, 2^61) (`exact` is false
/// otherwise): the approximate reciprocal refined by one Newton step, the quotient a * y,
/// then one correction by the residual a - b q. A zero a gives a itself (+0 or -0, as the
/// division does for a positive b).
__device__ __forceinline__ float div_rn_fast(float a, float b, bool& exact) {
  const std::uint32_t ea = (__float_as_uint(a) >> 23) & 0xFFu, eb = __float_as_uint(b) >> 23;  // b's sign: out of range
  exact = eb - (127u - 60u) <= 120u && (a == 0.0f || ea - (127u - 60u) <= 120u);
  float y = rcp_approx(b);
  y = __fmaf_rn(y, __fmaf_rn(-b, y, 1.0f), y);
  const float q = __fmul_rn(a, y);
  const float exact_q = __fmaf_rn(y, __fmaf_rn(-b, q, a), q);
  return a == 0.0f ? a : exact_q;
}

}  // namespace shardopt::kernels
