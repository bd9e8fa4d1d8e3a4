// grad_norm.cuh - the sum of squares of a shard's gradients with a fixed summation
// order, shared by the CUDA kernels (grad_norm.cu) and the host twin
// (grad_norm_host.cpp), so that both give the same bits on every run and device.
//
// The order: kGradNormBlocks blocks of kGradNormThreads threads. Block b takes chunks
// b, b + kGradNormBlocks, ...; in a chunk, a scalar head brings the buffer offset to a
// multiple of V (16 bytes of the grad dtype), vector k of the body goes to thread
// k mod kGradNormThreads, whose lane i accumulates element i of each of its vectors with
// fmaf; head and tail elements go to threads 0..V-1, lane 0. A thread's lanes are summed
// in lane order, a block's threads by a pairwise tree (t += t + stride, stride = 128 .. 1),
// and the finishing block sums the partials the same way (thread t first adds partials
// t, t + 256, ... in order). Which loads are vector loads changes nothing in the result.
#pragma once

#include <cmath>
#include <cstdint>

#include "shardopt/fused_adam.hpp"
#include "shardopt/numerics.hpp"

namespace shardopt::kernels {

/// Threads per block of both norm passes.
inline constexpr int kGradNormThreads = 256;

/// Arguments of the two norm passes.
struct GradNormParams {
  const ShardChunk* chunks = nullptr;
  std::int64_t num_chunks = 0;
  const void* grads = nullptr;
  bool vector_ok = true;          ///< grads base 16-byte aligned
  float* partials = nullptr;      ///< 2 * kGradNormBlocks floats: sums, then non-finite counts
  StepScalars* scalars = nullptr;
};

/// True for +-Inf and NaN.
SHARDOPT_HD bool is_nonfinite(float x) { return (num::f32_bits(x) & 0x7F800000u) == 0x7F800000u; }

/// Elements per vector of a grad dtype (16 bytes).
template <DType G>
inline constexpr int grad_norm_vec = 16 / static_cast<int>(sizeof(typename num::Storage<G>::type));

/// Loads V grads at element index idx: one 16-byte load on the device when allowed,
/// scalar loads otherwise (same values either way).
template <DType G, int V>
SHARDOPT_HD void load_grads(const void* grads, std::int64_t idx, bool vector_ok, float (&x)[V]) {
  using ST = typename num::Storage<G>::type;
  const ST* src = static_cast<const ST*>(grads) + idx;
#if defined(__CUDA_ARCH__)
  if (vector_ok) {
    alignas(16) ST raw[V];
    *reinterpret_cast<uint4*>(raw) = __ldg(reinterpret_cast<const uint4*>(src));
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = num::Storage<G>::load(raw[i]);
    return;
  }
#else
  (void)vector_ok;
#endif
  for (int i = 0; i < V; ++i) x[i] = num::Storage<G>::load(src[i]);
}

/// Thread `thread` of block `block` of the first pass: its sum of squares and whether
/// it met a non-finite element (1.0f) or not (0.0f).
template <DType G>
SHARDOPT_HD void sumsq_thread(const GradNormParams& a, int block, int thread, float& sum, float& bad) {
  constexpr int V = grad_norm_vec<G>;
  using ST = typename num::Storage<G>::type;
  const ST* grads = static_cast<const ST*>(a.grads);
  float acc[V];
  for (int i = 0; i < V; ++i) acc[i] = 0.0f;
  bool nonfinite = false;
  for (std::int64_t c = block; c < a.num_chunks; c += kGradNormBlocks) {
    const ShardChunk ch = a.chunks[c];
    std::int64_t head = (V - ch.buffer_offset % V) % V;
    if (head > ch.length) head = ch.length;
    const std::int64_t nvec = (ch.length - head) / V;
    const std::int64_t tail_begin = head + nvec * V;
    if (thread < head) {
      const float x = num::Storage<G>::load(grads[ch.buffer_offset + thread]);
      acc[0] = fmaf(x, x, acc[0]);
      nonfinite = nonfinite || is_nonfinite(x);
    }
    const std::int64_t b0 = ch.buffer_offset + head;
#if defined(__CUDA_ARCH__)
#pragma unroll 4
#endif
    for (std::int64_t k = thread; k < nvec; k += kGradNormThreads) {
      float x[V];
      load_grads<G, V>(a.grads, b0 + k * V, a.vector_ok, x);
      for (int i = 0; i < V; ++i) {
        acc[i] = fmaf(x[i], x[i], acc[i]);
        nonfinite = nonfinite || is_nonfinite(x[i]);
      }
    }
    if (tail_begin + thread < ch.length) {
      const float x = num::Storage<G>::load(grads[ch.buffer_offset + tail_begin + thread]);
      acc[0] = fmaf(x, x, acc[0]);
      nonfinite = nonfinite || is_nonfinite(x);
    }
  }
  float s = acc[0];
  for (int i = 1; i < V; ++i) s += acc[i];
  sum = s;
  bad = nonfinite ? 1.0f : 0.0f;
}

/// The finishing thread's share: partials t, t + kGradNormThreads, ... in order.
SHARDOPT_HD void finish_thread(const float* partials, int thread, float& sum, float& bad) {
  float s = 0.0f, b = 0.0f;
  for (int j = thread; j < kGradNormBlocks; j += kGradNormThreads) {
    s += partials[j];
    b += partials[kGradNormBlocks + j];
  }
  sum = s;
  bad = b;
}

/// Adds a finished total into the step scalars (thread 0 of the finishing block).
SHARDOPT_HD void add_norm_total(StepScalars* s, float sum, float bad) {
  s->grad_sumsq = s->grad_sumsq + sum;
  if (bad > 0.0f) s->nonfinite = s->nonfinite + 1.0f;
}

/// finalize_grad_norm's one thread.
SHARDOPT_HD void finalize_norm(float max_norm, StepScalars* s) {
  const float norm = sqrtf(s->grad_sumsq) * s->inv_loss_scale;
  s->grad_norm = norm;
  if (s->nonfinite > 0.0f || is_nonfinite(norm)) s->found_inf = 1;
  float coef = 1.0f;
  if (max_norm > 0.0f) {
    const float c = max_norm / (norm + 1e-6f);
    if (c < 1.0f) coef = c;  // NaN -> 1 (the step is skipped then anyway)
  }
  s->clip_coef = coef;
}

}  // namespace shardopt::kernels
