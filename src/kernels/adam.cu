// adam.cu - CUDA kernels of the fused Adam step: a one-thread prologue and one main
// pass that walks the shard's chunk table (one block per chunk, grid-stride over
// chunks), with 16-byte vector accesses in each chunk's aligned body and scalar code
// for its head and tail. The element math is adam_math.cuh, shared with the host twin.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/adam_launch.hpp"

namespace shardopt::kernels {
namespace {

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

/// Narrows N floats to dtype T and stores them at element index `idx`.
template <DType T, int N>
__device__ __forceinline__ void store_vec(void* base, std::int64_t idx, const float (&in)[N]) {
  using ST = storage_t<T>;
  constexpr int kBytes = N * static_cast<int>(sizeof(ST));
  ST* dst = static_cast<ST*>(base) + idx;
  alignas(16) ST raw[N];
#pragma unroll
  for (int i = 0; i < N; ++i) raw[i] = num::Storage<T>::store(in[i]);
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(raw)[i];
  } else {
    static_assert(kBytes == 8, "vectors are 8, 16 or 32 bytes");
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(raw);
  }
}

/// Updates U vectors of V elements: vector indices k, k + kAdamThreads, ... (relative
/// to the chunk body's first element s0 / b0). All loads are issued before any math.
template <class Tr, int U>
__device__ __forceinline__ void adam_vectors(const AdamApplyParams& a, const AdamStepValues& sv,
                                             std::int64_t s0, std::int64_t b0, std::int64_t k) {
  constexpr int V = Tr::vec;
  float g[U][V], p[U][V], m[U][V], v[U][V];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t e = (k + static_cast<std::int64_t>(u) * kAdamThreads) * V;
    load_vec<Tr::grad, V, true>(a.grads, b0 + e, g[u]);
    load_vec<DType::f32, V, false>(a.master, s0 + e, p[u]);
    load_vec<Tr::moment, V, false>(a.exp_avg, s0 + e, m[u]);
    load_vec<Tr::moment, V, false>(a.exp_avg_sq, s0 + e, v[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int i = 0; i < V; ++i) adam_element<Tr::decoupled>(a.consts, sv, g[u][i], p[u][i], m[u][i], v[u][i]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t e = (k + static_cast<std::int64_t>(u) * kAdamThreads) * V;
    store_vec<DType::f32, V>(a.master, s0 + e, p[u]);
    store_vec<Tr::moment, V>(a.exp_avg, s0 + e, m[u]);
    store_vec<Tr::moment, V>(a.exp_avg_sq, s0 + e, v[u]);
    if constexpr (Tr::write_params) store_vec<Tr::param, V>(a.params, b0 + e, p[u]);
  }
}

__global__ void adam_prologue_kernel(const AdamPrologueParams p, StepScalars* scalars) {
  adam_prologue(p, scalars);
}

template <class Tr>
__global__ void __launch_bounds__(kAdamThreads) adam_apply_kernel(const AdamApplyParams a) {
  if (a.scalars->found_inf != 0) return;  // a skipped step writes nothing
  constexpr int V = Tr::vec;
  constexpr int U = kAdamElementsPerIter / V;
  const std::int64_t t = threadIdx.x;
  for (std::int64_t c = blockIdx.x; c < a.num_chunks; c += gridDim.x) {
    const ShardChunk ch = a.chunks[c];
    const AdamStepValues sv = adam_step_values(a, ch.group);
    const ChunkSplit sp = split_chunk(ch, V, a.vector_ok);
    for (std::int64_t i = t; i < sp.head; i += kAdamThreads)
      adam_scalar<Tr>(a, sv, ch.shard_offset + i, ch.buffer_offset + i);
    const std::int64_t s0 = ch.shard_offset + sp.head;
    const std::int64_t b0 = ch.buffer_offset + sp.head;
    std::int64_t k = t;
    for (; k + (U - 1) * kAdamThreads < sp.nvec; k += U * kAdamThreads) adam_vectors<Tr, U>(a, sv, s0, b0, k);
    for (; k < sp.nvec; k += kAdamThreads) adam_vectors<Tr, 1>(a, sv, s0, b0, k);
    for (std::int64_t i = sp.head + sp.nvec * V + t; i < ch.length; i += kAdamThreads)
      adam_scalar<Tr>(a, sv, ch.shard_offset + i, ch.buffer_offset + i);
  }
}

}  // namespace

void launch_adam_prologue(const AdamPrologueParams& p, StepScalars* scalars, Stream stream) {
  adam_prologue_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(p, scalars);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_adam_apply(const AdamVariant& v, const AdamApplyParams& a, Stream stream) {
  if (a.num_chunks <= 0) return;
  // One block per chunk up to a cap; the kernel strides over the rest.
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(a.num_chunks, std::int64_t{1} << 20));
  dispatch_adam_variant(v, [&]<class Tr>() {
    adam_apply_kernel<Tr><<<grid, kAdamThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(a);
  });
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels

// Every kernel of this file, for load_step_kernels: the prologue and each compiled
// variant of the main pass (every combination dispatch_adam_variant can pick).
#include "kernels/kernel_files.hpp"

namespace shardopt::kernels {

void adam_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(adam_prologue_kernel));
  for (DType grad : {DType::f32, DType::bf16, DType::f16})
    for (DType moment : {DType::f32, DType::bf16})
      for (int out = 0; out < 4; ++out)  // no parameter output, then f32, bf16, f16 parameters
        for (bool decoupled : {true, false}) {
          const DType params[] = {DType::f32, DType::f32, DType::bf16, DType::f16};
          const AdamVariant v{grad, moment, params[out], out != 0, decoupled};
          dispatch_adam_variant(v, [&]<class Tr>() { visit(kernel_symbol(adam_apply_kernel<Tr>)); });
        }
}

}  // namespace shardopt::kernels
