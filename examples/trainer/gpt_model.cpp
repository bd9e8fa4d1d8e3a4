// gpt_model.cpp - the GPT's buffers, forward and backward (Model's members for
// ModelConfig::gpt; model.cpp has the MoE model, the head and the batches).
//
// Attention layout: the qkv projection gives [T, 3H] rows of [q | k | v], head h at
// columns h*D .. (h+1)*D of each (D = H / heads). Per head, one strided-batched GEMM over
// the B = T / S sequences computes the scores [S, S] of each sequence (scaled by
// 1/sqrt(D)); the causal softmax turns them into probabilities (f32, and bf16 for the
// next GEMM); a second batched GEMM gives the head's output columns of att [T, H].
#include <cmath>

#include "model.hpp"
#include "op_math.hpp"

namespace trainer {

void Model::make_gpt_buffers() {
  const std::int64_t T = c_.tokens, H = c_.hidden, F = c_.mlp, S = c_.context;
  const std::int64_t blocks = static_cast<std::int64_t>(c_.heads) * (T / S);
  const Elem act = ops_.act(), low = ops_.low();
  for (int l = 0; l < c_.layers; ++l) {
    Layer L;
    L.xn = make(low, T * H);
    L.rstd1 = make(act, T);
    L.qkv_low = make(low, T * 3 * H);
    L.attn_probs = make(act, blocks * S * S);
    L.attn_probs_low = make(low, blocks * S * S);
    L.att_low = make(low, T * H);
    L.h_mid = make(act, T * H);
    L.xm = make(low, T * H);
    L.rstd2 = make(act, T);
    L.u = make(act, T * F);
    L.a = make(low, T * F);
    layers_.push_back(std::move(L));
  }
  qkv_ = make(act, T * 3 * H);
  att_ = make(act, T * H);
  scores_ = make(act, blocks * S * S);
  dscores_low_ = make(low, blocks * S * S);
  dqkv_low_ = make(low, T * 3 * H);
  datt_low_ = make(low, T * H);
}

void Model::head_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const Tensor& a,
                      std::int64_t lda, std::int64_t sa, const Tensor& b, std::int64_t ldb, std::int64_t sb,
                      const Tensor& c, std::int64_t ldc, std::int64_t sc, Stream s) {
  GemmArgs g;
  g.trans_a = ta, g.trans_b = tb;
  g.m = m, g.n = n, g.k = k;
  g.alpha = alpha;
  g.a = a, g.lda = lda, g.stride_a = sa;
  g.b = b, g.ldb = ldb, g.stride_b = sb;
  g.c = c, g.ldc = ldc, g.stride_c = sc;
  g.batch = static_cast<int>(c_.tokens / c_.context);
  ops_.gemm(g, s);
}

namespace {

/// t from element `first` to its end.
Tensor from(const Tensor& t, std::int64_t first) { return t.slice(first, t.numel - first); }

}  // namespace

void Model::attention_forward(Layer& L, Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, S = c_.context, B = T / S, D = H / c_.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Tensor qkv = L.qkv_low.get();
  for (int h = 0; h < c_.heads; ++h) {
    const std::int64_t blk = h * B * S * S;
    // scores_b = scale * Q_b K_b^T  ([S, D] x [D, S] per sequence b)
    head_gemm(false, true, S, S, D, scale, from(qkv, h * D), 3 * H, S * 3 * H, from(qkv, H + h * D), 3 * H, S * 3 * H,
              from(scores_.get(), blk), S, S * S, s);
  }
  ops_.causal_softmax_forward(scores_, L.attn_probs, L.attn_probs_low, c_.heads * B, S, s);
  for (int h = 0; h < c_.heads; ++h) {
    const std::int64_t blk = h * B * S * S;
    // att_b[:, head h] = P_b V_b
    head_gemm(false, false, S, D, S, 1.0f, from(L.attn_probs_low.get(), blk), S, S * S, from(qkv, 2 * H + h * D),
              3 * H, S * 3 * H, from(att_.get(), h * D), H, S * H, s);
  }
}

void Model::attention_backward(Layer& L, Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, S = c_.context, B = T / S, D = H / c_.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Tensor qkv = L.qkv_low.get(), dqkv = qkv_.get(), dO = datt_low_.get();
  for (int h = 0; h < c_.heads; ++h) {
    const std::int64_t blk = h * B * S * S;
    // dP_b = dO_b V_b^T (into the scores scratch), dV_b = P_b^T dO_b
    head_gemm(false, true, S, S, D, 1.0f, from(dO, h * D), H, S * H, from(qkv, 2 * H + h * D), 3 * H, S * 3 * H,
              from(scores_.get(), blk), S, S * S, s);
    head_gemm(true, false, S, D, S, 1.0f, from(L.attn_probs_low.get(), blk), S, S * S, from(dO, h * D), H, S * H,
              from(dqkv, 2 * H + h * D), 3 * H, S * 3 * H, s);
  }
  ops_.causal_softmax_backward(scores_, L.attn_probs, dscores_low_, c_.heads * B, S, s);
  for (int h = 0; h < c_.heads; ++h) {
    const std::int64_t blk = h * B * S * S;
    // dQ_b = scale * dS_b K_b, dK_b = scale * dS_b^T Q_b
    head_gemm(false, false, S, D, S, scale, from(dscores_low_.get(), blk), S, S * S, from(qkv, H + h * D), 3 * H,
              S * 3 * H, from(dqkv, h * D), 3 * H, S * 3 * H, s);
    head_gemm(true, false, S, D, S, scale, from(dscores_low_.get(), blk), S, S * S, from(qkv, h * D), 3 * H, S * 3 * H,
              from(dqkv, H + h * D), 3 * H, S * 3 * H, s);
  }
}

void Model::forward_gpt(Weights& w, Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, S = c_.context;
  const float eps = math::kNormEps;
  w.forward_unit(0, s);
  ops_.embed_forward(compute_weight(w, spec_.embed(), s, true), tokens_, h_[0], T, H, s);
  ops_.pos_embed_forward(compute_weight(w, spec_.pos_embed(), s, true), h_[0], T, S, H, s);
  for (int l = 0; l < c_.layers; ++l) {
    const BlockParams& b = spec_.blocks()[static_cast<std::size_t>(l)];
    Layer& L = layers_[static_cast<std::size_t>(l)];
    const Tensor& h = h_[static_cast<std::size_t>(l)];
    w.forward_unit(l + 1, s);
    // Attention: h_mid = h + proj(attention(qkv(norm1(h)))).
    ops_.rmsnorm_forward(h, w.param(b.norm1), L.xn, L.rstd1, T, H, eps, s);
    linear_forward(L.xn, compute_weight(w, b.qkv, s, true), qkv_, T, H, 3 * H, 0.0f, s);
    ops_.to_low(qkv_, L.qkv_low, T * 3 * H, s);
    attention_forward(L, s);
    ops_.to_low(att_, L.att_low, T * H, s);
    ops_.copy(L.h_mid, h, s);
    linear_forward(L.att_low, compute_weight(w, b.proj, s, true), L.h_mid, T, H, H, 1.0f, s);
    // MLP: h_out = h_mid + down(gelu(up(norm2(h_mid)))).
    ops_.rmsnorm_forward(L.h_mid, w.param(b.norm2), L.xm, L.rstd2, T, H, eps, s);
    mlp_forward(w, b, L.xm, L.u, L.a, L.h_mid, h_[static_cast<std::size_t>(l) + 1], s);
  }
}

void Model::backward_gpt(Weights& w, Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, S = c_.context;
  // dh_ holds the gradient of the last block's output (head_backward).
  for (int l = c_.layers - 1; l >= 0; --l) {
    const BlockParams& b = spec_.blocks()[static_cast<std::size_t>(l)];
    Layer& L = layers_[static_cast<std::size_t>(l)];
    w.backward_unit(l + 1, true, s);
    // MLP.
    mlp_backward(w, b, L.xm, L.u, L.a, s);
    ops_.rmsnorm_backward(dx_, L.h_mid, w.param(b.norm2), L.rstd2, dh_, w.grad(b.norm2), partial_, T, H, s);
    stats_and_ready(w, b.norm2, s);
    // Attention (dh_ is now the gradient of h_mid).
    ops_.to_low(dh_, dy_low_, T * H, s);
    linear_wgrad(dy_low_, L.att_low, w.grad(b.proj), T, H, H, s);
    linear_dgrad(dy_low_, compute_weight(w, b.proj, s, false), att_, T, H, H, 0.0f, s);
    stats_and_ready(w, b.proj, s);
    ops_.to_low(att_, datt_low_, T * H, s);
    attention_backward(L, s);
    ops_.to_low(qkv_, dqkv_low_, T * 3 * H, s);
    linear_wgrad(dqkv_low_, L.xn, w.grad(b.qkv), T, H, 3 * H, s);
    linear_dgrad(dqkv_low_, compute_weight(w, b.qkv, s, false), dx_, T, H, 3 * H, 0.0f, s);
    stats_and_ready(w, b.qkv, s);
    ops_.rmsnorm_backward(dx_, h_[static_cast<std::size_t>(l)], w.param(b.norm1), L.rstd1, dh_, w.grad(b.norm1),
                          partial_, T, H, s);
    stats_and_ready(w, b.norm1, s);
    w.backward_unit_done(l + 1, s);
  }
  // Embeddings: their backward needs no parameters (no gather in FSDP).
  w.backward_unit(0, false, s);
  ops_.pos_embed_backward(dh_, w.grad(spec_.pos_embed()), T, S, H, s);
  stats_and_ready(w, spec_.pos_embed(), s);
  ops_.embed_backward(dh_, tokens_, links_buf_, w.grad(spec_.embed()), T, H, s);
  stats_and_ready(w, spec_.embed(), s);
  w.backward_unit_done(0, s);
}

}  // namespace trainer
