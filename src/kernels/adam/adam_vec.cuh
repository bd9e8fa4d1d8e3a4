// adam_vec.cuh - the 16-byte vector loads and stores of the fused Adam kernels (adam.cu,
// and the MXFP8 tile pass of mxfp8_shard.cu that runs Adam on the owned tile rows):
// N elements of one dtype widened to float or narrowed from it. CUDA only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/adam/adam_math.cuh"

namespace shardopt::kernels {

/// Loads N consecutive elements of dtype T at element index `idx` (N * sizeof(T) bytes,
/// aligned to min(16, that)) and widens them to float. kReadOnly: through the
/// non-coherent read-only path (the gradients, which the kernel never writes).
template <DType T, int N, bool kReadOnly>
__device__ __forceinline__ void load_vec(const void* base, std::int64_t idx, float (&out)[N]) {
  using ST = storage_t<T>;
  constexpr int kBytes = N * static_cast<int>(sizeof(ST));
  const ST* src = static_cast<const ST*>(base) + idx;
  alignas(16) ST raw[N];
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4* s = reinterpret_cast<const uint4*>(src) + i;
      reinterpret_cast<uint4*>(raw)[i] = kReadOnly ? __ldg(s) : *s;
    }
  } else {
    static_assert(kBytes == 8, "vectors are 8, 16 or 32 bytes");
    const uint2* s = reinterpret_cast<const uint2*>(src);
    *reinterpret_cast<uint2*>(raw) = kReadOnly ? __ldg(s) : *s;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = num::Storage<T>::load(raw[i]);
}

/// 32-bit word j of `raw` (32-bit elements, or pairs of 16-bit ones, little-endian). The
/// stores below write whole vector values built from such words with __stwb (a plain
/// write-back store, emitted as one vector instruction): a copy out of a local array can
/// come out of the compiler as several narrower stores, at up to half the bandwidth
/// (bench_adam's bf16grad-bf16param row, H200: 21.2 ms instead of 11.9).
template <class ST>
__device__ __forceinline__ std::uint32_t word_of(const ST* raw, int j) {
  if constexpr (sizeof(ST) == 4) {
    return __float_as_uint(raw[j]);
  } else {
    static_assert(sizeof(ST) == 2, "16- and 32-bit elements");
    return static_cast<std::uint32_t>(raw[2 * j]) | (static_cast<std::uint32_t>(raw[2 * j + 1]) << 16);
  }
}

/// 16 and 8 bytes of `raw` as one vector value.
template <class ST>
__device__ __forceinline__ uint4 pack16(const ST* raw) {
  return make_uint4(word_of(raw, 0), word_of(raw, 1), word_of(raw, 2), word_of(raw, 3));
}
template <class ST>
__device__ __forceinline__ uint2 pack8(const ST* raw) {
  return make_uint2(word_of(raw, 0), word_of(raw, 1));
}

/// Narrows N floats to dtype T and stores them at element index `idx`, in 16-byte (or one
/// 8-byte) stores.
template <DType T, int N>
__device__ __forceinline__ void store_vec(void* base, std::int64_t idx, const float (&in)[N]) {
  using ST = storage_t<T>;
  constexpr int kBytes = N * static_cast<int>(sizeof(ST));
  constexpr int kPer16 = 16 / static_cast<int>(sizeof(ST));
  ST* dst = static_cast<ST*>(base) + idx;
  ST raw[N];
#pragma unroll
  for (int i = 0; i < N; ++i) raw[i] = num::Storage<T>::store(in[i]);
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) __stwb(reinterpret_cast<uint4*>(dst) + i, pack16(raw + i * kPer16));
  } else {
    static_assert(kBytes == 8, "vectors are 8, 16 or 32 bytes");
    __stwb(reinterpret_cast<uint2*>(dst), pack8(raw));
  }
}

/// Loads N consecutive 16-bit words at element index `idx` (2N bytes, aligned to
/// min(16, that)) as they are: the raw bits of bf16 parameters and of remainders.
template <int N>
__device__ __forceinline__ void load_bits16(const void* base, std::int64_t idx, std::uint16_t (&out)[N]) {
  static_assert(N == 8 || N == 4, "vectors are 8 or 16 bytes");
  const std::uint16_t* src = static_cast<const std::uint16_t*>(base) + idx;
  if constexpr (N == 8) {
    *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(src);
  } else {
    *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(src);
  }
}

/// Stores N 16-bit words at element index `idx` (the counterpart of load_bits16), in one
/// vector store.
template <int N>
__device__ __forceinline__ void store_bits16(void* base, std::int64_t idx, const std::uint16_t (&in)[N]) {
  static_assert(N == 8 || N == 4, "vectors are 8 or 16 bytes");
  std::uint16_t* dst = static_cast<std::uint16_t*>(base) + idx;
  if constexpr (N == 8) {
    __stwb(reinterpret_cast<uint4*>(dst), pack16(in));
  } else {
    __stwb(reinterpret_cast<uint2*>(dst), pack8(in));
  }
}

}  // namespace shardopt::kernels
