// adam.cu - CUDA kernels of the fused Adam step: a one-thread prologue and one main
// pass that walks the shard's chunk table (one block per chunk, grid-stride over
// chunks), with 16-byte vector accesses in each chunk's aligned body and scalar code
// for its head and tail. The element math is adam_math.cuh, shared with the host twin.
// Buffers whose master is the bf16 parameter plus a remainder have their own variants
// (AdamVariant::remainder): they read and write the two 16-bit halves instead of an fp32
// master. For NVFP4 buffers a second instantiation also emits the partial amaxes of the new
// master while it is in registers (AmaxSink; the others compile NoAmax, which is nothing).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/adam/adam_launch.hpp"
#include "kernels/adam/adam_vec.cuh"

namespace shardopt::kernels {
namespace {

/// Updates U vectors of V elements: vector indices k, k + kAdamThreads, ... (relative
/// to the chunk body's first element s0 / b0; its moments at s0 - ms). All loads are
/// issued before any math.
template <class Tr, int U, class Sink>
__device__ __forceinline__ void adam_vectors(const AdamApplyParams& a, const AdamStepValues& sv,
                                             std::int64_t s0, std::int64_t b0, std::int64_t ms, std::int64_t k,
                                             std::int64_t i0, Sink& sink) {
  constexpr int V = Tr::vec;
  float g[U][V], p[U][V], m[U][V], v[U][V];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t e = (k + static_cast<std::int64_t>(u) * kAdamThreads) * V;
    load_vec<Tr::grad, V, true>(a.grads, b0 + e, g[u]);
    if constexpr (Tr::remainder) {  // the master from the bf16 param and its remainder
      alignas(16) std::uint16_t hi[V], lo[V];
      load_bits16<V>(a.params, b0 + e, hi);
      load_bits16<V>(a.remainder, s0 + e, lo);
#pragma unroll
      for (int i = 0; i < V; ++i) p[u][i] = num::remainder_join(hi[i], lo[i]);
    } else {
      load_vec<DType::f32, V, false>(a.master, s0 + e, p[u]);
    }
    load_vec<Tr::moment, V, false>(a.exp_avg, s0 - ms + e, m[u]);
    load_vec<Tr::moment, V, false>(a.exp_avg_sq, s0 - ms + e, v[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int i = 0; i < V; ++i) adam_element<Tr::decoupled>(a.consts, sv, g[u][i], p[u][i], m[u][i], v[u][i]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t e = (k + static_cast<std::int64_t>(u) * kAdamThreads) * V;
    sink.template vector<V>(i0 + e, p[u]);
    store_vec<Tr::moment, V>(a.exp_avg, s0 - ms + e, m[u]);
    store_vec<Tr::moment, V>(a.exp_avg_sq, s0 - ms + e, v[u]);
    if constexpr (Tr::remainder) {
      alignas(16) std::uint16_t hi[V], lo[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        hi[i] = num::remainder_split_param(p[u][i]);
        lo[i] = num::remainder_split_low(p[u][i]);
      }
      store_bits16<V>(a.params, b0 + e, hi);
      store_bits16<V>(a.remainder, s0 + e, lo);
    } else {
      store_vec<DType::f32, V>(a.master, s0 + e, p[u]);
      if constexpr (Tr::write_params) store_vec<Tr::param, V>(a.params, b0 + e, p[u]);
    }
  }
}

/// The sink of the variants that emit nothing (bf16, MXFP8 and native buffers): every
/// call compiles away, so their kernels are the ones without emission.
struct NoAmax {
  static constexpr bool kEmits = false;
  __device__ __forceinline__ void begin(std::int64_t, const ShardChunk&) {}
  template <int V>
  __device__ __forceinline__ void vector(std::int64_t, const float (&)[V]) {}
  __device__ __forceinline__ void element(std::int64_t, float) {}
  __device__ __forceinline__ void end() {}
};

/// Shared u32 slots of one block: the block entries a chunk can touch when its block rows
/// span at most this many entries (16 KB); wider chunks fold into global memory directly.
inline constexpr int kAmaxSharedSlots = 4096;

/// NVFP4 partial amaxes of the chunks' new master values (the same u32 values as
/// nvfp4_partial_amax writes: integer maxima of adam_amax_of, in any order). Per chunk
/// its entry is read once; block entries fold into shared slots (one shared atomicMax
/// per vector that lies in one 16-column run of a row, else per element) and, at the
/// chunk's end, into the buffer with one global atomicMax per nonzero slot; a member's
/// range amax is a running max per thread, one atomicMax per warp (per lane when the
/// warp's lanes are in different members). begin / end are called by every thread.
struct AmaxSink {
  static constexpr bool kEmits = true;
  const AdamAmaxChunk* table;
  std::uint32_t* slots;
  AdamAmaxChunk e{};
  bool on = false, shared = false;  // block-uniform
  std::int64_t lo = 0, span = 0;    // the shared slots hold entries [lo, lo + span)
  std::int64_t tslot = -1;          // this thread's running member entry and max
  std::uint32_t tmax = 0;

  __device__ __forceinline__ void begin(std::int64_t c, const ShardChunk& ch) {
    e = table[c];
    on = e.amax != nullptr && ch.length > 0;
    tslot = -1;
    tmax = 0;
    shared = false;
    if (on) {
      // From the first block row of the chunk's first element to the last block row of its
      // last one (a row's blocks are not in element order across rows).
      const std::int64_t q0 = e.first, q1 = e.first + ch.length - 1;
      const std::int64_t g0 = q0 / e.member_numel, g1 = q1 / e.member_numel;
      const std::int64_t r0 = (q0 - g0 * e.member_numel) / e.cols, r1 = (q1 - g1 * e.member_numel) / e.cols;
      lo = g0 * e.amax_numel + (r0 / 16) * e.block_cols;
      span = g1 * e.amax_numel + (r1 / 16 + 1) * e.block_cols - lo;
      shared = span <= kAmaxSharedSlots;
      if (shared)
        for (std::int64_t j = threadIdx.x; j < span; j += kAdamThreads) slots[j] = 0;
    }
    __syncthreads();
  }
  __device__ __forceinline__ void put(std::int64_t slot, std::uint32_t v) {
    if (v == 0) return;  // every entry starts at 0
    if (shared) {
      atomicMax(slots + (slot - lo), v);
    } else {
      atomicMax(e.amax + slot, v);
    }
  }
  __device__ __forceinline__ void tensor(std::int64_t slot, std::uint32_t v) {
    if (slot != tslot) {
      if (tslot >= 0 && tmax != 0) atomicMax(e.amax + tslot, tmax);
      tslot = slot;
      tmax = 0;
    }
    tmax = max(tmax, v);
  }
  /// Element i of the chunk (chunk-local index), new master p.
  __device__ __forceinline__ void element(std::int64_t i, float p) {
    if (!on) return;
    const std::int64_t q = e.first + i;
    const std::uint32_t v = adam_amax_of(p);
    put(adam_amax_block_slot(e, q), v);
    tensor(adam_amax_tensor_slot(e, q), v);
  }
  /// V consecutive elements from chunk-local index i.
  template <int V>
  __device__ __forceinline__ void vector(std::int64_t i, const float (&p)[V]) {
    if (!on) return;
    const std::int64_t q = e.first + i;
    const std::int64_t g = q / e.member_numel, m = q - g * e.member_numel;
    const std::int64_t r = m / e.cols, c = m - r * e.cols;
    if (e.cols % 16 != 0 || c % 16 + V > 16) {  // not in one 16-column run of a row
#pragma unroll
      for (int j = 0; j < V; ++j) element(i + j, p[j]);
      return;
    }
    // One run: the max of the magnitudes' bits, rounded once (rounding to bf16 is
    // monotone, so this is the max of the rounded elements; NaN bits sort above Inf).
    std::uint32_t mag = 0;
#pragma unroll
    for (int j = 0; j < V; ++j) mag = max(mag, num::f32_bits(p[j]) & 0x7FFFFFFFu);
    const std::uint32_t v = adam_amax_of(num::f32_from_bits(mag));
    put(g * e.amax_numel + (r / 16) * e.block_cols + c / 16, v);
    tensor((g + 1) * e.amax_numel - 1, v);
  }
  __device__ __forceinline__ void end() {
    if (on) {
      constexpr unsigned kFull = 0xFFFFFFFFu;
      const std::int64_t s0 = __shfl_sync(kFull, tslot, 0);
      if (__all_sync(kFull, tslot == s0)) {
        const std::uint32_t m = __reduce_max_sync(kFull, tmax);
        if ((threadIdx.x & 31) == 0 && s0 >= 0 && m != 0) atomicMax(e.amax + s0, m);
      } else if (tslot >= 0 && tmax != 0) {
        atomicMax(e.amax + tslot, tmax);
      }
      __syncthreads();
      if (shared) {
        for (std::int64_t j = threadIdx.x; j < span; j += kAdamThreads) {
          const std::uint32_t v = slots[j];
          if (v != 0) atomicMax(e.amax + lo + j, v);
        }
      }
    }
    __syncthreads();  // the next chunk's begin zeroes the slots
  }
};

__global__ void adam_prologue_kernel(const AdamPrologueParams p, StepScalars* scalars) {
  adam_prologue(p, scalars);
}

/// The walk over the chunks. skipped (a found-inf step, only with an emitting sink):
/// nothing is written but the amaxes of the master as it is.
template <class Tr, class Sink>
__device__ __forceinline__ void adam_walk(const AdamApplyParams& a, Sink& sink, bool skipped) {
  constexpr int V = Tr::vec;
  constexpr int U = kAdamElementsPerIter / V;
  const std::int64_t t = threadIdx.x;
  for (std::int64_t c = blockIdx.x; c < a.num_chunks; c += gridDim.x) {
    const ShardChunk ch = a.chunks[c];
    sink.begin(c, ch);
    if (Sink::kEmits && skipped) {
      for (std::int64_t i = t; i < ch.length; i += kAdamThreads) sink.element(i, a.master[ch.shard_offset + i]);
    } else {
      const AdamStepValues sv = adam_step_values(a, ch.group);
      const ChunkSplit sp = split_chunk(ch, V, a.vector_ok);
      for (std::int64_t i = t; i < sp.head; i += kAdamThreads)
        sink.element(i, adam_scalar<Tr>(a, sv, ch.shard_offset + i, ch.buffer_offset + i, ch.moment_shift));
      const std::int64_t s0 = ch.shard_offset + sp.head;
      const std::int64_t b0 = ch.buffer_offset + sp.head;
      std::int64_t k = t;
      for (; k + (U - 1) * kAdamThreads < sp.nvec; k += U * kAdamThreads)
        adam_vectors<Tr, U>(a, sv, s0, b0, ch.moment_shift, k, sp.head, sink);
      for (; k < sp.nvec; k += kAdamThreads) adam_vectors<Tr, 1>(a, sv, s0, b0, ch.moment_shift, k, sp.head, sink);
      for (std::int64_t i = sp.head + sp.nvec * V + t; i < ch.length; i += kAdamThreads)
        sink.element(i, adam_scalar<Tr>(a, sv, ch.shard_offset + i, ch.buffer_offset + i, ch.moment_shift));
    }
    sink.end();
  }
}

/// The variants without emission: a skipped step writes nothing and returns at once.
template <class Tr>
__global__ void __launch_bounds__(kAdamThreads) adam_apply_kernel(const AdamApplyParams a) {
  if (a.scalars->found_inf != 0) return;  // a skipped step writes nothing
  NoAmax sink;
  adam_walk<Tr>(a, sink, false);
}

/// Blocks per SM the emitting variant is compiled for (64 registers a thread at most).
inline constexpr int kAmaxBlocksPerSm = 4;

/// The variant that emits NVFP4 partial amaxes (a.amax set). It also runs on a skipped
/// step, reading the master for its amaxes and writing nothing else.
template <class Tr>
__global__ void __launch_bounds__(kAdamThreads, kAmaxBlocksPerSm) adam_apply_amax_kernel(const AdamApplyParams a) {
  __shared__ std::uint32_t slots[kAmaxSharedSlots];
  AmaxSink sink{a.amax, slots};
  adam_walk<Tr>(a, sink, a.scalars->found_inf != 0);
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
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  dispatch_adam_variant<true>(v, [&]<class Tr>() {
    if constexpr (!Tr::write_params) {  // only buffers without params (NVFP4) emit amaxes
      if (a.amax != nullptr) {
        adam_apply_amax_kernel<Tr><<<grid, kAdamThreads, 0, s>>>(a);
        return;
      }
    }
    adam_apply_kernel<Tr><<<grid, kAdamThreads, 0, s>>>(a);
  });
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels

// Every kernel of this file, for load_step_kernels: the prologue and each compiled
// variant of the main pass and of its amax-emitting twin (every combination
// dispatch_adam_variant can pick).
#include "kernels/common/kernel_files.hpp"

namespace shardopt::kernels {

void adam_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(adam_prologue_kernel));
  for (DType grad : {DType::f32, DType::bf16, DType::f16})
    for (DType moment : {DType::f32, DType::bf16})
      for (int out = 0; out < 4; ++out)  // no parameter output, then f32, bf16, f16 parameters
        for (bool decoupled : {true, false}) {
          const DType params[] = {DType::f32, DType::f32, DType::bf16, DType::f16};
          const AdamVariant v{grad, moment, params[out], out != 0, decoupled};
          dispatch_adam_variant(v, [&]<class Tr>() {
            visit(kernel_symbol(adam_apply_kernel<Tr>));
            // the NVFP4 amax-emitting variant of the buffers without parameter output
            if constexpr (!Tr::write_params) visit(kernel_symbol(adam_apply_amax_kernel<Tr>));
          });
          if (params[out] == DType::bf16) {  // the bf16 buffers' remainder variant
            const AdamVariant r{grad, moment, DType::bf16, true, decoupled, true};
            dispatch_adam_variant<true>(r, [&]<class Tr>() { visit(kernel_symbol(adam_apply_kernel<Tr>)); });
          }
        }
}

}  // namespace shardopt::kernels
