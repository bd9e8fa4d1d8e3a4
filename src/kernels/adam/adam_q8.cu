// adam_q8.cu - the fused Adam main pass over 8-bit block-quantized moments
// (DType::q8_block), and the conversions of whole moment arrays between their 8-bit
// form and fp32 (checkpoints). One warp updates one block of kMomentBlock elements: 8
// per lane, the block's new scales by warp shuffles, no shared-memory reduction. The
// element math is adam_q8.cuh's, shared with the host twin.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/check.hpp"
#include "kernels/adam/adam_launch.hpp"
#include "kernels/adam/adam_q8.cuh"
#include "kernels/adam/adam_vec.cuh"
#include "kernels/common/kernel_files.hpp"

namespace shardopt::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kPerLane = static_cast<int>(kMomentBlock) / kWarp;  // 8
constexpr unsigned kFullMask = 0xFFFFFFFFu;
static_assert(kPerLane == 8, "one 8-byte word of codes per lane");

__constant__ MomentMaps kDeviceMaps = make_moment_maps();

/// The maps in shared memory (their lookups depend on the data).
__device__ __forceinline__ void load_maps(MomentMaps& maps) {
  for (int i = threadIdx.x; i < 128; i += blockDim.x) maps.first[i] = kDeviceMaps.first[i];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) maps.second[i] = kDeviceMaps.second[i];
  __syncthreads();
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

/// One lane's 8 elements of one block: chunk-relative first element e0, n of them valid.
template <class Tr>
__device__ __forceinline__ void q8_lane(const AdamApplyParams& a, const AdamStepValues& sv, const MomentMaps& maps,
                                        const ShardChunk& ch, std::int64_t e0, int n, std::int64_t block) {
  const std::int64_t si0 = ch.shard_offset + e0, bi0 = ch.buffer_offset + e0;
  const std::int64_t mi0 = ch.shard_offset - ch.moment_shift + e0;
  auto* mc = static_cast<std::uint8_t*>(a.exp_avg);
  auto* vc = static_cast<std::uint8_t*>(a.exp_avg_sq);
  // A full lane with aligned offsets takes vector accesses (every array's base is
  // 16-byte aligned when vector_ok; codes are 8 bytes at a multiple of 8).
  const bool vec = n == kPerLane && a.vector_ok && bi0 % kPerLane == 0 && si0 % kPerLane == 0;
  std::uint8_t m_code[kPerLane] = {}, v_code[kPerLane] = {};
  float g[kPerLane] = {}, p[kPerLane] = {};
  if (vec) {
    *reinterpret_cast<uint2*>(m_code) = *reinterpret_cast<const uint2*>(mc + mi0);
    *reinterpret_cast<uint2*>(v_code) = *reinterpret_cast<const uint2*>(vc + mi0);
    load_vec<Tr::grad, kPerLane, true>(a.grads, bi0, g);
    if constexpr (Tr::remainder) {
      std::uint16_t hi[kPerLane], lo[kPerLane];
      load_bits16<kPerLane>(a.params, bi0, hi);
      load_bits16<kPerLane>(a.remainder, si0, lo);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) p[i] = num::remainder_join(hi[i], lo[i]);
    } else {
      load_vec<DType::f32, kPerLane, false>(a.master, si0, p);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i >= n) break;
      m_code[i] = mc[mi0 + i];
      v_code[i] = vc[mi0 + i];
      g[i] = adam_q8_load_grad<Tr>(a, bi0 + i);
      p[i] = adam_load_master<Tr>(a, si0 + i, bi0 + i);
    }
  }
  const float m_scale = a.exp_avg_scale[block], r_scale = a.exp_avg_sq_scale[block];
  float m[kPerLane] = {}, r[kPerLane] = {};
  float m_max = 0.0f, r_max = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (i < n) {
      adam_q8_element<Tr::decoupled>(a.consts, sv, maps, g[i], p[i], m_code[i], v_code[i], m_scale, r_scale, m[i], r[i]);
      m_max = fmaxf(m_max, fabsf(m[i]));
      r_max = fmaxf(r_max, r[i]);
    }
  }
  m_max = warp_max(m_max);  // every lane of the block's warp takes part, valid or not
  r_max = warp_max(r_max);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    m_code[i] = i < n ? encode_first_moment(maps.first, m[i], m_max) : 0;
    v_code[i] = i < n ? encode_second_moment(maps.second, r[i], r_max) : 0;
  }
  if (vec) {
    *reinterpret_cast<uint2*>(mc + mi0) = *reinterpret_cast<const uint2*>(m_code);
    *reinterpret_cast<uint2*>(vc + mi0) = *reinterpret_cast<const uint2*>(v_code);
    if constexpr (Tr::remainder) {
      std::uint16_t hi[kPerLane], lo[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        hi[i] = num::remainder_split_param(p[i]);
        lo[i] = num::remainder_split_low(p[i]);
      }
      store_bits16<kPerLane>(a.params, bi0, hi);
      store_bits16<kPerLane>(a.remainder, si0, lo);
    } else {
      store_vec<DType::f32, kPerLane>(a.master, si0, p);
      if constexpr (Tr::write_params) store_vec<Tr::param, kPerLane>(a.params, bi0, p);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i >= n) break;
      mc[mi0 + i] = m_code[i];
      vc[mi0 + i] = v_code[i];
      adam_store_master<Tr>(a, si0 + i, bi0 + i, p[i]);
    }
  }
  if ((threadIdx.x & (kWarp - 1)) == 0) {
    a.exp_avg_scale[block] = m_max;
    a.exp_avg_sq_scale[block] = r_max;
  }
}

template <class Tr>
__global__ void __launch_bounds__(kAdamThreads) adam_q8_kernel(const AdamApplyParams a) {
  if (a.scalars->found_inf != 0) return;  // a skipped step writes nothing
  __shared__ MomentMaps maps;
  load_maps(maps);
  const int lane = static_cast<int>(threadIdx.x) & (kWarp - 1);
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  constexpr int kWarps = kAdamThreads / kWarp;
  for (std::int64_t c = blockIdx.x; c < a.num_chunks; c += gridDim.x) {
    const ShardChunk ch = a.chunks[c];
    const AdamStepValues sv = adam_step_values(a, ch.group);
    const std::int64_t first_block = (ch.shard_offset - ch.moment_shift) / kMomentBlock;
    const std::int64_t blocks = (ch.length + kMomentBlock - 1) / kMomentBlock;
    for (std::int64_t b = warp; b < blocks; b += kWarps) {
      const std::int64_t e0 = b * kMomentBlock + lane * kPerLane;
      const std::int64_t left = ch.length - e0;
      const int n = left <= 0 ? 0 : (left >= kPerLane ? kPerLane : static_cast<int>(left));
      q8_lane<Tr>(a, sv, maps, ch, e0, n, first_block + b);
    }
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
    out[i] = second ? decode_second_moment(maps.second, codes[i], s) : decode_first_moment(maps.first, codes[i], s);
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
          second ? encode_second_moment(maps.second, x[i], mx) : encode_first_moment(maps.first, x[i], mx);
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
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(a.num_chunks, std::int64_t{1} << 20));
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
