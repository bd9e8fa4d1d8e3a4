// host_ops.hpp - the model's operations in plain C++, generic in their storage types.
//
// Instantiated in mixed precision (fp32 activations and accumulation, bf16 GEMM inputs
// and parameters) for the host backend, and in double precision for the gradient checks
// (test/unit/test_trainer_ops.cpp), so the backward formulas checked against finite
// differences are the ones the host trainer runs. The CUDA kernels (cuda_*.cu, one file
// per op family) implement the same formulas; test/gpu/test_trainer_ops_gpu.cpp compares them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <shardopt/microbatch.hpp>

#include "op_math.hpp"
#include "ops.hpp"

namespace trainer::host {

/// bf16 storage on the host (the bits).
struct Bf16 {
  std::uint16_t bits;
};

inline float load(float x) { return x; }
inline double load(double x) { return x; }
inline float load(Bf16 x) { return math::from_bf16(x.bits); }
inline void store(float& d, float v) { d = v; }
inline void store(double& d, double v) { d = v; }
inline void store(Bf16& d, float v) { d.bits = math::to_bf16(v); }

/// The accumulation (and arithmetic) type for activations of type R: float or double.
template <class R> using Acc = std::conditional_t<std::is_same_v<R, double>, double, float>;

inline float silu(float u) { return math::silu(u); }
inline double silu(double u) { return u / (1.0 + std::exp(-u)); }
inline float silu_grad(float u) { return math::silu_grad(u); }
inline double silu_grad(double u) {
  const double s = 1.0 / (1.0 + std::exp(-u));
  return s * (1.0 + u * (1.0 - s));
}
inline float exp_(float x) { return std::exp(x); }
inline double exp_(double x) { return std::exp(x); }
inline float log_(float x) { return std::log(x); }
inline double log_(double x) { return std::log(x); }
inline float rsqrt_(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt_(double x) { return 1.0 / std::sqrt(x); }

/// Row-major C = alpha op(A) op(B) + beta C (see GemmArgs), accumulated in A_ in k order.
template <class A_, class TA, class TB, class TC>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, A_ alpha, const TA* a, std::int64_t lda,
          const TB* b, std::int64_t ldb, A_ beta, TC* c, std::int64_t ldc) {
  std::vector<A_> row(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), A_(0));
    for (std::int64_t p = 0; p < k; ++p) {
      const A_ x = load(ta ? a[p * lda + i] : a[i * lda + p]);
      if (tb) {
        for (std::int64_t j = 0; j < n; ++j) row[static_cast<std::size_t>(j)] += x * static_cast<A_>(load(b[j * ldb + p]));
      } else {
        for (std::int64_t j = 0; j < n; ++j) row[static_cast<std::size_t>(j)] += x * static_cast<A_>(load(b[p * ldb + j]));
      }
    }
    for (std::int64_t j = 0; j < n; ++j) {
      TC& out = c[i * ldc + j];
      A_ v = alpha * row[static_cast<std::size_t>(j)];
      if (beta != A_(0)) v = v + beta * static_cast<A_>(load(out));
      store(out, v);
    }
  }
}

template <class P, class R>
void embed_forward(const P* table, const std::int32_t* tokens, R* out, std::int64_t T, std::int64_t H) {
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h) out[t * H + h] = static_cast<R>(load(table[tokens[t] * H + h]));
}

/// links[t] = the next position with the same token (or -1); the first position of each
/// token sums its chain in token order and adds the sum to the table row once.
template <class R, class D>
void embed_backward(const R* dout, const std::int32_t* tokens, std::int32_t* links, D* dtable, std::int64_t T,
                    std::int64_t H) {
  for (std::int64_t t = 0; t < T; ++t) {
    links[t] = -1;
    for (std::int64_t u = t + 1; u < T; ++u)
      if (tokens[u] == tokens[t]) {
        links[t] = static_cast<std::int32_t>(u);
        break;
      }
  }
  for (std::int64_t t = 0; t < T; ++t) {
    bool first = true;
    for (std::int64_t u = 0; u < t && first; ++u) first = tokens[u] != tokens[t];
    if (!first) continue;
    for (std::int64_t h = 0; h < H; ++h) {
      Acc<R> s = 0;
      for (std::int64_t u = t; u >= 0; u = links[u]) s += dout[u * H + h];
      D& d = dtable[tokens[t] * H + h];
      store(d, static_cast<Acc<R>>(load(d)) + s);
    }
  }
}

template <class R, class P, class L>
void rmsnorm_forward(const R* x, const P* w, L* y, R* rstd, std::int64_t T, std::int64_t H, float eps) {
  for (std::int64_t t = 0; t < T; ++t) {
    Acc<R> ss = 0;
    for (std::int64_t h = 0; h < H; ++h) ss += x[t * H + h] * x[t * H + h];
    const Acc<R> r = rsqrt_(ss / static_cast<Acc<R>>(H) + static_cast<Acc<R>>(eps));
    rstd[t] = r;
    for (std::int64_t h = 0; h < H; ++h) store(y[t * H + h], x[t * H + h] * r * static_cast<Acc<R>>(load(w[h])));
  }
}

/// dx += r (dy w) - x r^3 / H * sum_h(dy w x);  dw += sum_t dy x r.
template <class R, class P, class D>
void rmsnorm_backward(const R* dy, const R* x, const P* w, const R* rstd, R* dx, D* dw, std::int64_t T,
                      std::int64_t H) {
  using A = Acc<R>;
  for (std::int64_t t = 0; t < T; ++t) {
    const A r = rstd[t];
    A dot = 0;
    for (std::int64_t h = 0; h < H; ++h) dot += dy[t * H + h] * static_cast<A>(load(w[h])) * x[t * H + h];
    const A c = dot * r * r * r / static_cast<A>(H);
    for (std::int64_t h = 0; h < H; ++h)
      dx[t * H + h] += r * (dy[t * H + h] * static_cast<A>(load(w[h]))) - x[t * H + h] * c;
  }
  for (std::int64_t h = 0; h < H; ++h) {
    A s = 0;
    for (std::int64_t t = 0; t < T; ++t) s += dy[t * H + h] * x[t * H + h] * rstd[t];
    store(dw[h], static_cast<A>(load(dw[h])) + s);
  }
}

template <class R, class L>
void silu_forward(const R* u, L* a, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) store(a[i], silu(u[i]));
}

template <class R, class L>
void silu_backward(const R* da, const R* u, L* du, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) store(du[i], da[i] * silu_grad(u[i]));
}

template <class R, class L>
void to_low(const R* x, L* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) store(y[i], x[i]);
}

template <class R>
void router_forward(const R* logits, R* probs, std::int32_t* expert, R* gate, std::int64_t T, int G) {
  for (std::int64_t t = 0; t < T; ++t) {
    const R* l = logits + t * G;
    int best = 0;
    for (int j = 1; j < G; ++j)
      if (l[j] > l[best]) best = j;
    Acc<R> s = 0;
    for (int j = 0; j < G; ++j) s += exp_(l[j] - l[best]);
    for (int j = 0; j < G; ++j) probs[t * G + j] = exp_(l[j] - l[best]) / s;
    expert[t] = best;
    gate[t] = probs[t * G + best];
  }
}

template <class R, class L>
void router_backward(const R* dgate, const R* probs, const std::int32_t* expert, L* dlogits, std::int64_t T, int G) {
  for (std::int64_t t = 0; t < T; ++t) {
    const R g = probs[t * G + expert[t]];
    for (int j = 0; j < G; ++j) {
      const R onehot = j == expert[t] ? R(1) : R(0);
      store(dlogits[t * G + j], dgate[t] * g * (onehot - probs[t * G + j]));
    }
  }
}

template <class L>
void dispatch(const std::int32_t* expert, const L* x, std::int32_t* slot, std::int32_t* row_token, L* xe,
              std::int64_t T, std::int64_t H, int G, std::int64_t C) {
  std::vector<std::int64_t> count(static_cast<std::size_t>(G), 0);
  for (std::int64_t r = 0; r < G * C; ++r) row_token[r] = -1;
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t s = count[static_cast<std::size_t>(expert[t])]++;
    slot[t] = s < C ? static_cast<std::int32_t>(s) : -1;
    if (s < C) row_token[expert[t] * C + s] = static_cast<std::int32_t>(t);
  }
  for (std::int64_t r = 0; r < G * C; ++r) {
    if (row_token[r] >= 0) {
      std::memcpy(xe + r * H, x + row_token[r] * H, static_cast<std::size_t>(H) * sizeof(L));
    } else {
      std::memset(static_cast<void*>(xe + r * H), 0, static_cast<std::size_t>(H) * sizeof(L));
    }
  }
}

template <class R>
void combine_forward(const R* ye, const std::int32_t* expert, const std::int32_t* slot, const R* gate, R* h,
                     std::int64_t T, std::int64_t H, std::int64_t C) {
  for (std::int64_t t = 0; t < T; ++t) {
    if (slot[t] < 0) continue;
    const R* y = ye + (expert[t] * C + slot[t]) * H;
    for (std::int64_t k = 0; k < H; ++k) h[t * H + k] += gate[t] * y[k];
  }
}

template <class R, class L>
void combine_backward(const R* dh, const R* ye, const std::int32_t* expert, const std::int32_t* slot, const R* gate,
                      const std::int32_t* row_token, L* dye, R* dgate, std::int64_t T, std::int64_t H, int G,
                      std::int64_t C) {
  for (std::int64_t r = 0; r < G * C; ++r) {
    const std::int32_t t = row_token[r];
    for (std::int64_t k = 0; k < H; ++k) store(dye[r * H + k], t >= 0 ? gate[t] * dh[t * H + k] : R(0));
  }
  for (std::int64_t t = 0; t < T; ++t) {
    Acc<R> s = 0;
    if (slot[t] >= 0) {
      const R* y = ye + (expert[t] * C + slot[t]) * H;
      for (std::int64_t k = 0; k < H; ++k) s += dh[t * H + k] * y[k];
    }
    dgate[t] = s;
  }
}

template <class R>
void dispatch_backward(const R* dxe, const std::int32_t* expert, const std::int32_t* slot, R* dx, std::int64_t T,
                       std::int64_t H, std::int64_t C) {
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t k = 0; k < H; ++k) dx[t * H + k] = slot[t] >= 0 ? dxe[(expert[t] * C + slot[t]) * H + k] : R(0);
}

template <class R, class L>
void cross_entropy(const R* logits, const std::int32_t* targets, L* dlogits, R* token_loss, R* loss_slot,
                   Acc<R> grad_scale, std::int64_t T, std::int64_t V) {
  using A = Acc<R>;
  A total = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    const R* l = logits + t * V;
    A m = l[0];
    for (std::int64_t v = 1; v < V; ++v) m = std::max<A>(m, l[v]);
    A s = 0;
    for (std::int64_t v = 0; v < V; ++v) s += exp_(static_cast<A>(l[v]) - m);
    const A lse = m + log_(s);
    token_loss[t] = lse - l[targets[t]];
    total += token_loss[t];
    for (std::int64_t v = 0; v < V; ++v) {
      const A p = exp_(static_cast<A>(l[v]) - m) / s;
      store(dlogits[t * V + v], grad_scale * (p - (v == targets[t] ? A(1) : A(0))));
    }
  }
  *loss_slot = total / static_cast<A>(T);
}

template <class D, class A>
A sum_of_squares(const D* x, std::int64_t n) {
  A s = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const A v = static_cast<A>(load(x[i]));
    s += v * v;
  }
  return s;
}

}  // namespace trainer::host
