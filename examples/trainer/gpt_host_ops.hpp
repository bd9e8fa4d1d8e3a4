// gpt_host_ops.hpp - the GPT model's own operations in plain C++ (positions, GELU, causal
// softmax, text windows), generic in their storage types like host_ops.hpp: instantiated
// in mixed precision for the host backend and in double precision for the gradient checks.
// The CUDA kernels (cuda_embed.cu, cuda_activation.cu, cuda_attention.cu, cuda_data.cu)
// implement the same formulas.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_ops.hpp"

namespace trainer::host {

inline float gelu(float x) { return math::gelu(x); }
inline double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline float gelu_grad(float x) { return math::gelu_grad(x); }
inline double gelu_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

template <class P, class R>
void pos_embed_forward(const P* table, R* h, std::int64_t T, std::int64_t S, std::int64_t H) {
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t k = 0; k < H; ++k) h[t * H + k] += static_cast<R>(load(table[(t % S) * H + k]));
}

template <class R, class D>
void pos_embed_backward(const R* dh, D* dtable, std::int64_t T, std::int64_t S, std::int64_t H) {
  for (std::int64_t p = 0; p < S; ++p)
    for (std::int64_t k = 0; k < H; ++k) {
      Acc<R> s = 0;
      for (std::int64_t t = p; t < T; t += S) s += dh[t * H + k];
      store(dtable[p * H + k], static_cast<Acc<R>>(load(dtable[p * H + k])) + s);
    }
}

template <class R, class L>
void gelu_forward(const R* u, L* a, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) store(a[i], gelu(u[i]));
}

template <class R, class L>
void gelu_backward(const R* da, const R* u, L* du, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) store(du[i], da[i] * gelu_grad(u[i]));
}

template <class R, class L>
void causal_softmax_forward(const R* scores, R* probs, L* probs_low, std::int64_t blocks, std::int64_t S) {
  for (std::int64_t r = 0; r < blocks * S; ++r) {
    const std::int64_t i = r % S;
    const R* x = scores + r * S;
    Acc<R> m = x[0];
    for (std::int64_t j = 1; j <= i; ++j) m = std::max<Acc<R>>(m, x[j]);
    Acc<R> s = 0;
    for (std::int64_t j = 0; j <= i; ++j) s += exp_(static_cast<Acc<R>>(x[j]) - m);
    for (std::int64_t j = 0; j < S; ++j) {
      const Acc<R> p = j <= i ? exp_(static_cast<Acc<R>>(x[j]) - m) / s : Acc<R>(0);
      probs[r * S + j] = p;
      store(probs_low[r * S + j], p);
    }
  }
}

template <class R, class L>
void causal_softmax_backward(const R* dprobs, const R* probs, L* dscores, std::int64_t blocks, std::int64_t S) {
  for (std::int64_t r = 0; r < blocks * S; ++r) {
    const std::int64_t i = r % S;
    Acc<R> dot = 0;
    for (std::int64_t j = 0; j <= i; ++j) dot += probs[r * S + j] * dprobs[r * S + j];
    for (std::int64_t j = 0; j < S; ++j)
      store(dscores[r * S + j], j <= i ? probs[r * S + j] * (dprobs[r * S + j] - dot) : Acc<R>(0));
  }
}

inline void text_batch(const TextBatchArgs& a, std::int64_t step, std::int32_t mb, std::int32_t* tokens,
                       std::int32_t* targets) {
  for (std::int64_t j = 0; j < a.seqs; ++j) {
    const std::int64_t start = math::window_start(a.seed, a.rank, step, mb, j, a.data_tokens - a.context);
    for (std::int64_t i = 0; i < a.context; ++i) {
      tokens[j * a.context + i] = a.data[start + i];
      targets[j * a.context + i] = a.data[start + i + 1];
    }
  }
}

}  // namespace trainer::host
