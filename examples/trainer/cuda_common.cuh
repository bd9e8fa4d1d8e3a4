// cuda_common.cuh - what the trainer's CUDA files (cuda_*.cu) share: the error checks of
// CUDA and cuBLAS calls, launch shapes, the loads and stores of fp32 / bf16 storage, and the
// fixed-order block reductions.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include <shardopt/error.hpp>

#include "op_math.hpp"
#include "ops.hpp"

namespace trainer::gpu {

inline void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    throw shardopt::Error(shardopt::ErrorCode::Cuda, std::string(call) + " failed: " + cudaGetErrorString(e) + " (at " +
                                                         file + ":" + std::to_string(line) + ")");
}
inline void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw shardopt::Error(shardopt::ErrorCode::Cuda, std::string(call) + " failed: cuBLAS status " +
                                                         std::to_string(static_cast<int>(s)) + " (at " + file + ":" +
                                                         std::to_string(line) + ")");
}
#define TRAINER_CUDA(call) cuda_check((call), #call, __FILE__, __LINE__)
#define TRAINER_CUBLAS(call) cublas_check((call), #call, __FILE__, __LINE__)
#define TRAINER_LAUNCHED() cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

using i64 = std::int64_t;
using bf16 = std::uint16_t;

constexpr int kThreads = 256;

inline unsigned blocks_for(i64 n, int threads = kThreads) {
  const i64 b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

inline cudaStream_t cu(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

// ---------------------------------------------------------------- storage

__device__ __forceinline__ float ld(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, i64 i) { return math::from_bf16(p[i]); }
__device__ __forceinline__ void st(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, i64 i, float v) { p[i] = math::to_bf16(v); }

/// Sum over the block in a fixed order (shuffle tree in each warp, then warp 0 over the
/// warp sums). Every thread gets the result. `shared` holds 32 values.
template <class T>
__device__ T block_sum(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  // Only warp 0 reads the warp sums, and it has read them all (__syncwarp) before its
  // lane 0 overwrites shared[0]: no other warp reads a slot that is being written.
  const int warps = (blockDim.x + 31) / 32;
  if (warp == 0) {
    T total = lane < warps ? shared[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    __syncwarp();
    if (lane == 0) shared[0] = total;
  }
  __syncthreads();
  const T total = shared[0];
  __syncthreads();
  return total;
}

__device__ inline float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  if (warp == 0) {  // as in block_sum
    float m = lane < warps ? shared[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncwarp();
    if (lane == 0) shared[0] = m;
  }
  __syncthreads();
  const float m = shared[0];
  __syncthreads();
  return m;
}

}  // namespace trainer::gpu
