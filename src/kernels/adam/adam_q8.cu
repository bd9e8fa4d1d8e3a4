// adam_q8.cu - the fused Adam main pass over 8-bit block-quantized moments
// (DType::q8_block), and the conversions of whole moment arrays between their 8-bit
// form and fp32 (checkpoints). One warp updates one block of kMomentBlock elements: 8
// per lane, the block's new scales by warp shuffles, no shared-memory reduction. The
// element math is adam_q8.cuh's, shared with the host twin.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/adam/adam_launch.hpp"
#include "kernels/adam/adam_q8.cuh"
#include "kernels/adam/adam_vec.cuh"
#include "kernels/common/device_attribute.cuh"
#include "kernels/common/kernel_files.hpp"
#include "kernels/common/rn_fast_path.cuh"

namespace shardopt::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kPerLane = static_cast<int>(kMomentBlock) / kWarp;  // 8
constexpr unsigned kFullMask = 0xFFFFFFFFu;
static_assert(kPerLane == 8, "one 8-byte word of codes per lane");

// Global memory, not __constant__: every thread of a block copies a different word (the
// constant cache serializes a warp's different addresses).
__device__ const MomentMaps kDeviceMaps = make_moment_maps();

/// Blocks of the 8-bit pass resident per SM (its launch bounds; the grid is as many).
constexpr int kQ8BlocksPerSm = 3;

/// Work units per chunk: the resident blocks stride over (chunk, slice) units, so that a
/// launch over a few hundred chunks (one bucket) still spreads evenly over them.
constexpr std::int64_t kQ8Slices = 8;

/// The maps and their code tables in shared memory (their lookups depend on the data),
/// copied as 4-byte words.
__device__ __forceinline__ void load_maps(MomentMaps& maps) {
  static_assert(sizeof(MomentMaps) % 4 == 0 && alignof(MomentMaps) == 4);
  constexpr int kWords = static_cast<int>(sizeof(MomentMaps) / 4);
  const auto* from = reinterpret_cast<const std::uint32_t*>(&kDeviceMaps);
  auto* to = reinterpret_cast<std::uint32_t*>(&maps);
  for (int i = threadIdx.x; i < kWords; i += blockDim.x) to[i] = from[i];
  __syncthreads();
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

/// A lane's 8 code bytes as one 8-byte value (little-endian: byte i is element i), and
/// back: one vector access each, whatever the compiler makes of a byte array.
__device__ __forceinline__ uint2 pack_codes(const std::uint8_t (&c)[kPerLane]) {
  std::uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) w[i / 4] |= static_cast<std::uint32_t>(c[i]) << (8 * (i % 4));
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ void unpack_codes(uint2 v, std::uint8_t (&c)[kPerLane]) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) c[i] = static_cast<std::uint8_t>(((i < 4 ? v.x : v.y) >> (8 * (i % 4))) & 0xFFu);
}

/// Where one lane's 8 elements of one block lie, and how many of them are valid.
struct LaneSlice {
  std::int64_t si0 = 0, bi0 = 0, mi0 = 0;  ///< shard, buffer and moment index of the first
  int n = 0;                               ///< valid elements, 0..8
  bool vec = false;                        ///< all 8 valid and aligned: vector accesses
};

/// The lane's slice of chunk-relative block b. A full lane with aligned offsets takes
/// vector accesses (every array's base is 16-byte aligned when vector_ok; codes are 8
/// bytes at a multiple of 8).
__device__ __forceinline__ LaneSlice lane_slice(const AdamApplyParams& a, const ShardChunk& ch, std::int64_t b,
                                                int lane) {
  LaneSlice s;
  const std::int64_t e0 = b * kMomentBlock + lane * kPerLane;
  const std::int64_t left = ch.length - e0;
  s.n = left <= 0 ? 0 : (left >= kPerLane ? kPerLane : static_cast<int>(left));
  s.si0 = ch.shard_offset + e0;
  s.bi0 = ch.buffer_offset + e0;
  s.mi0 = ch.shard_offset - ch.moment_shift + e0;
  s.vec = s.n == kPerLane && a.vector_ok && s.bi0 % kPerLane == 0 && s.si0 % kPerLane == 0;
  return s;
}

/// Loads the slice's moment bytes, gradients and masters.
template <class Tr>
__device__ __forceinline__ void load_slice(const AdamApplyParams& a, const LaneSlice& s, std::uint8_t (&m_code)[kPerLane],
                                           std::uint8_t (&v_code)[kPerLane], float (&g)[kPerLane],
                                           float (&p)[kPerLane]) {
  const auto* mc = static_cast<const std::uint8_t*>(a.exp_avg);
  const auto* vc = static_cast<const std::uint8_t*>(a.exp_avg_sq);
  if (s.vec) {
    unpack_codes(*reinterpret_cast<const uint2*>(mc + s.mi0), m_code);
    unpack_codes(*reinterpret_cast<const uint2*>(vc + s.mi0), v_code);
    load_vec<Tr::grad, kPerLane, true>(a.grads, s.bi0, g);
    if constexpr (Tr::remainder) {
      std::uint16_t hi[kPerLane], lo[kPerLane];
      load_bits16<kPerLane>(a.params, s.bi0, hi);
      load_bits16<kPerLane>(a.remainder, s.si0, lo);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) p[i] = num::remainder_join(hi[i], lo[i]);
    } else {
      load_vec<DType::f32, kPerLane, false>(a.master, s.si0, p);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      m_code[i] = v_code[i] = 0;
      g[i] = p[i] = 0.0f;
      if (i < s.n) {
        m_code[i] = mc[s.mi0 + i];
        v_code[i] = vc[s.mi0 + i];
        g[i] = adam_q8_load_grad<Tr>(a, s.bi0 + i);
        p[i] = adam_load_master<Tr>(a, s.si0 + i, s.bi0 + i);
      }
    }
  }
}

/// Stores the slice's new masters (and parameters): they do not wait for the new scales.
template <class Tr>
__device__ __forceinline__ void store_masters(const AdamApplyParams& a, const LaneSlice& s, const float (&p)[kPerLane]) {
  if (s.vec) {
    if constexpr (Tr::remainder) {
      std::uint16_t hi[kPerLane], lo[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        hi[i] = num::remainder_split_param(p[i]);
        lo[i] = num::remainder_split_low(p[i]);
      }
      store_bits16<kPerLane>(a.params, s.bi0, hi);
      store_bits16<kPerLane>(a.remainder, s.si0, lo);
    } else {
      store_vec<DType::f32, kPerLane>(a.master, s.si0, p);
      if constexpr (Tr::write_params) store_vec<Tr::param, kPerLane>(a.params, s.bi0, p);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (i < s.n) adam_store_master<Tr>(a, s.si0 + i, s.bi0 + i, p[i]);
  }
}

/// Encodes and stores the slice's moment bytes under the block's new scales.
__device__ __forceinline__ void store_codes(const AdamApplyParams& a, const MomentMaps& maps, const LaneSlice& s,
                                            const float (&m)[kPerLane], const float (&r)[kPerLane], float m_max,
                                            float r_max) {
  auto* mc = static_cast<std::uint8_t*>(a.exp_avg);
  auto* vc = static_cast<std::uint8_t*>(a.exp_avg_sq);
  const CodeScale ms = code_scale(m_max), rs = code_scale(r_max);  // one reciprocal each per lane
  std::uint8_t m_code[kPerLane], v_code[kPerLane];
  if (ms.fast && rs.fast) {  // the usual case: no branch per element
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      m_code[i] = encode_first_moment<true>(maps, m[i], ms);
      v_code[i] = encode_second_moment<true>(maps, r[i], rs);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      m_code[i] = encode_first_moment(maps, m[i], ms);
      v_code[i] = encode_second_moment(maps, r[i], rs);
    }
  }
  if (s.vec) {
    __stwb(reinterpret_cast<uint2*>(mc + s.mi0), pack_codes(m_code));
    __stwb(reinterpret_cast<uint2*>(vc + s.mi0), pack_codes(v_code));
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (i < s.n) {
        mc[s.mi0 + i] = m_code[i];
        vc[s.mi0 + i] = v_code[i];
      }
  }
}

/// One warp's update of chunk-relative block b (a block past the chunk's end has no valid
/// element). The masters are stored before the scale reductions, so that fewer values
/// stay live across the shuffles. (Two blocks per warp, loads first, did not pay:
/// docs/tuning.md.)
template <class Tr>
__device__ __forceinline__ void q8_block(const AdamApplyParams& a, const AdamStepValues& sv, const MomentMaps& maps,
                                         const ShardChunk& ch, std::int64_t b, std::int64_t first_block, int lane) {
  const LaneSlice s = lane_slice(a, ch, b, lane);
  std::uint8_t m_code[kPerLane], v_code[kPerLane];
  float g[kPerLane], p[kPerLane];
  load_slice<Tr>(a, s, m_code, v_code, g, p);
  const float m_scale = a.exp_avg_scale[first_block + b], r_scale = a.exp_avg_sq_scale[first_block + b];
  // The element math in its parts, each over the lane's 8 elements (positions past the
  // chunk's end compute on zeros and are neither stored nor counted): the square roots and
  // divisions take their fast paths without a branch per element (rn_fast_path.cuh), and
  // the lane redoes all 8 with sqrtf and / when any valid input lies outside their range.
  float m[kPerLane], v[kPerLane], r[kPerLane], quot[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    adam_q8_moments<Tr::decoupled>(a.consts, sv, maps, g[i], p[i], m_code[i], v_code[i], m_scale, r_scale, m[i], v[i]);
  bool exact = true;  // positions past the end count too: their zeros are in range (eps >= 2^-60)
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    bool root_exact, quot_exact;
    r[i] = sqrt_rn_fast(v[i], root_exact);
    quot[i] = div_rn_fast(m[i], adam_denominator(a.consts, sv, r[i]), quot_exact);
    exact = exact && root_exact && quot_exact;
  }
  if (!exact) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      r[i] = sqrtf(v[i]);
      quot[i] = m[i] / adam_denominator(a.consts, sv, r[i]);
    }
  }
  // The block's maxima over every position: one past the end holds m = r = 0 (its zeros
  // decode to 0 and update to 0) or NaN (an infinite old scale), which fmaxf ignores.
  float m_max = 0.0f, r_max = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    adam_apply_quotient(sv, quot[i], p[i]);
    m_max = fmaxf(m_max, fabsf(m[i]));
    r_max = fmaxf(r_max, r[i]);
  }
  store_masters<Tr>(a, s, p);
  m_max = warp_max(m_max);  // every lane of the warp takes part, valid or not
  r_max = warp_max(r_max);
  store_codes(a, maps, s, m, r, m_max, r_max);
  if (lane == 0) {
    a.exp_avg_scale[first_block + b] = m_max;
    a.exp_avg_sq_scale[first_block + b] = r_max;
  }
}

template <class Tr>
__global__ void __launch_bounds__(kAdamThreads, kQ8BlocksPerSm) adam_q8_kernel(const AdamApplyParams a) {
  if (a.scalars->found_inf != 0) return;  // a skipped step writes nothing
  __shared__ MomentMaps maps;
  load_maps(maps);
  const int lane = static_cast<int>(threadIdx.x) & (kWarp - 1);
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  constexpr int kWarps = kAdamThreads / kWarp;
  // Work unit: slice j of chunk c, the chunk's blocks j * kWarps + warp + k * kQ8Slices *
  // kWarps (k = 0, 1, ...): a full chunk of 65536 elements is 8 units of 32 blocks.
  for (std::int64_t u = blockIdx.x; u < a.num_chunks * kQ8Slices; u += gridDim.x) {
    const ShardChunk ch = a.chunks[u / kQ8Slices];
    const std::int64_t blocks = (ch.length + kMomentBlock - 1) / kMomentBlock;
    const std::int64_t b0 = (u % kQ8Slices) * kWarps + warp;
    if (b0 >= blocks) continue;
    const AdamStepValues sv = adam_step_values(a, ch.group);
    const std::int64_t first_block = (ch.shard_offset - ch.moment_shift) / kMomentBlock;
    for (std::int64_t b = b0; b < blocks; b += kQ8Slices * kWarps) q8_block<Tr>(a, sv, maps, ch, b, first_block, lane);
  }
}

/// Whole moment arrays (n a multiple of kMomentBlock): bytes + scales -> fp32 values.
__global__ void q8_decode_kernel(const std::uint8_t* __restrict__ codes, const float* __restrict__ scales,
                                 float* __restrict__ out, std::int64_t n, bool second) {
  __shared__ MomentMaps maps;
  load_maps(maps);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float s = scales[i / kMomentBlock];
    out[i] = second ? decode_second_moment(maps, codes[i], s) : decode_first_moment(maps, codes[i], s);
  }
}

/// fp32 values -> bytes + scales, one warp per block (the scale is the block's max).
__global__ void q8_encode_kernel(const float* __restrict__ in, std::uint8_t* __restrict__ codes,
                                 float* __restrict__ scales, std::int64_t n, bool second) {
  __shared__ MomentMaps maps;
  load_maps(maps);
  const int lane = static_cast<int>(threadIdx.x) & (kWarp - 1);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (std::int64_t b = blockIdx.x * static_cast<std::int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
       b < n / kMomentBlock; b += warps) {
    float x[kPerLane];
    float mx = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const float v = in[b * kMomentBlock + lane * kPerLane + i];
      x[i] = second ? sqrtf(v) : v;
      mx = fmaxf(mx, second ? x[i] : fabsf(x[i]));
    }
    mx = warp_max(mx);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      codes[b * kMomentBlock + lane * kPerLane + i] =
          second ? encode_second_moment(maps, x[i], mx) : encode_first_moment(maps, x[i], mx);
    if (lane == 0) scales[b] = mx;
  }
}

unsigned grid_for(std::int64_t items, int per_block) {
  const std::int64_t g = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(g < 1 ? 1 : (g > 4096 ? 4096 : g));
}

}  // namespace

void launch_adam_q8_apply(const AdamVariant& v, const AdamApplyParams& a, Stream stream) {
  if (a.num_chunks <= 0) return;
  // As many blocks as stay resident (the kernel strides over the work units), so that each
  // copies the maps and code tables (25 KB) once.
  const std::int64_t resident = std::int64_t{kQ8BlocksPerSm} * std::max(1, device_attribute<cudaDevAttrMultiProcessorCount>());
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(a.num_chunks * kQ8Slices, resident));
  dispatch_adam_variant<true, true>(v, [&]<class Tr>() {
    adam_q8_kernel<Tr><<<grid, kAdamThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(a);
  });
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_q8_decode(const std::uint8_t* codes, const float* scales, float* out, std::int64_t n, bool second,
                      Stream stream) {
  if (n <= 0) return;
  q8_decode_kernel<<<grid_for(n, 256), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(codes, scales, out, n, second);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_q8_encode(const float* in, std::uint8_t* codes, float* scales, std::int64_t n, bool second, Stream stream) {
  if (n <= 0) return;
  q8_encode_kernel<<<grid_for(n / kMomentBlock, 8), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(in, codes, scales,
                                                                                                      n, second);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

// Every kernel of this file, for load_step_kernels.
void adam_q8_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(q8_decode_kernel));
  visit(kernel_symbol(q8_encode_kernel));
  for (DType grad : {DType::f32, DType::bf16, DType::f16})
    for (int out = 0; out < 5; ++out)  // no parameter output, f32, bf16, f16 parameters, bf16 + remainder
      for (bool decoupled : {true, false}) {
        const DType params[] = {DType::f32, DType::f32, DType::bf16, DType::f16, DType::bf16};
        const AdamVariant v{grad, DType::q8_block, params[out], out != 0, decoupled, out == 4};
        dispatch_adam_variant<true, true>(v, [&]<class Tr>() { visit(kernel_symbol(adam_q8_kernel<Tr>)); });
      }
}

}  // namespace shardopt::kernels
