// model.hpp - forward and backward of the trainer's model over an Ops implementation.
//
// One microbatch = make the batch (on the device, from the device step and microbatch
// counters), forward, cross entropy, backward. Every weight gradient is accumulated with
// beta = 1 GEMMs into the gradient views (zeroed once per step by the optimizer), so
// one captured iteration serves every microbatch. Everything that varies per
// microbatch is read from the device when it runs (a host value read at capture time
// would be frozen into the graph): the batch, the loss slot, the skip-weight-update flag
// of the weights prepared for compute, and when the per-parameter gradient statistics
// are taken.
//
// Weights prepared for compute: discrete expert weights are packed into one [G, ...]
// tensor per layer, and MXFP8 weights (ModelOptions::mxfp8_params) are decoded from their
// rowwise planes into persistent bf16 compute buffers -- Hopper has no MXFP8 GEMM. Both
// happen in the forward of the first microbatch of a step only (the device flag
// skip_weight_update), and the backward reads what the forward prepared.
//
// Shapes are static for a config: buffers are allocated once, so every pointer a
// captured graph holds stays valid.
#pragma once

#include <cstdint>
#include <vector>

#include <shardopt/microbatch.hpp>

#include "model_spec.hpp"
#include "ops.hpp"
#include "weights.hpp"

namespace trainer {

/// Options of a Model.
struct ModelOptions {
  /// Microbatches per step: the number of loss slots; gradients are scaled by
  /// 1 / (tokens * microbatches) so that they average over the step.
  int microbatches = 1;
  /// The token stream (BatchArgs::scalars / microbatch point at the optimizer's device
  /// state); with generate_batch false, set_batch() provides the tokens instead.
  BatchArgs batch;
  bool generate_batch = true;
  /// The device microbatch state (skip-weight-update flag, loss slot index, when the
  /// gradient statistics are taken). Null: first and last microbatch every time.
  const shardopt::MicrobatchState* microbatch = nullptr;
  /// The weights are gathered per use (FSDP): discrete experts are packed for compute on
  /// every use into one shared buffer, instead of once per step into one per layer.
  bool gathered_weights = false;
  /// Per-parameter gradient sums of squares on the device (group norms).
  bool grad_stats = true;
  /// Every parameter of two or more dimensions is MXFP8 (Weights::is_mxfp8; norm weights
  /// stay native): the GEMMs and the embedding read bf16 copies decoded from the rowwise
  /// planes once per step into persistent compute buffers (discrete experts: into the
  /// per-layer packed buffers). Persistent weights only (not with gathered_weights).
  bool mxfp8_params = false;
  /// The same with NVFP4 parameters (Weights::is_nvfp4): decoded by shardopt::dequantize_nvfp4
  /// member by member, on the first microbatch of a step (its device skip flag reads
  /// skip_weight_update).
  bool nvfp4_params = false;
  /// --task shakespeare: each microbatch is config.tokens / config.context windows of
  /// `context` tokens of this token file (u8 tokens in device memory; the mapped file on
  /// the host backend) at positions drawn from (batch.seed, batch.rank, the device step,
  /// the microbatch index, window) instead of make_batch's random tokens.
  const std::uint8_t* text = nullptr;
  std::int64_t text_tokens = 0;
  /// DELIBERATELY WRONG, for the regression test's negative control only: weight-gradient
  /// GEMMs overwrite (beta = 0) on the first microbatch, decided by a host counter at
  /// enqueue time. Eager runs are still right; a graph that reuses one captured
  /// microbatch freezes the capture-time choice, the bug TransformerEngine's GroupedLinear
  /// had (its MoE weight gradients came out far too small under graph replay).
  bool seed000_host_flag = false;
};

class Model {
 public:
  Model(const ModelSpec& spec, Ops& ops, ModelOptions options);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// One microbatch: batch, forward, loss, backward (gradients accumulate).
  void microbatch(Weights& w, Stream stream);
  /// Pieces of microbatch() (in this order).
  void make_batch(Stream stream);
  void forward(Weights& w, Stream stream);
  void backward(Weights& w, Stream stream);

  /// The seed of the generated batches (read when the batch op is enqueued: a graph
  /// captured before keeps the old one).
  void set_seed(std::uint64_t seed) noexcept { opt_.batch.seed = seed; }
  /// Prepares every persistent weight for compute now, unconditionally: decodes the MXFP8
  /// compute buffers and packs (or decodes) discrete experts into the per-layer buffers,
  /// what the next step's first microbatch would do. After the parameters changed outside
  /// a step (a checkpoint load), so that nothing derived from them is stale. A no-op with
  /// gathered weights (packed on every use).
  void refresh_weights(Weights& w, Stream stream);

  /// Evaluation (no gradient, no optimizer): the batch of evaluation index `index` --
  /// windows of `val` (val_tokens u8 tokens, device memory) at positions drawn from
  /// (seed, rank, index), or with val null the synthetic task's tokens of (seed ^ a
  /// constant, rank, step = index) -- into the model's token buffers.
  void make_eval_batch(std::int64_t index, const std::uint8_t* val, std::int64_t val_tokens, Stream stream);
  /// A forward pass of the batch in the token buffers that writes its mean token loss
  /// into eval_loss() and the logits into logits(), touching no gradient and no loss slot
  /// of training: prepares the persistent weights for compute first (refresh_weights) and
  /// ends an FSDP forward-only pass after it. Between iterations only.
  void eval_forward(Weights& w, Stream stream);
  /// The mean token loss of the last eval_forward (act, one element).
  const Tensor& eval_loss() const noexcept { return eval_loss_.get(); }

  /// Sets the tokens and targets of the next microbatch (generate_batch = false).
  void set_batch(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets);

  /// Mean token loss of each microbatch of the step (act, microbatches elements).
  const Tensor& loss_slots() const noexcept { return loss_slots_; }
  /// Per-parameter gradient sum of squares (act, one per parameter; see Weights::sumsq_when).
  const Tensor& grad_sumsq() const noexcept { return grad_sumsq_; }
  const Tensor& tokens() const noexcept { return tokens_; }
  const Tensor& logits() const noexcept { return logits_; }
  /// The bf16 weights the GEMMs read for MXFP8 parameter i (member `member` of a grouped
  /// one; -1: whole), as the last refresh left them: its compute buffer, or the slice of
  /// its layer's packed buffer for a discrete expert. std::logic_error without mxfp8_params
  /// or for a native parameter.
  Tensor compute_buffer(int i, int member = -1) const;
  /// Bytes of activations and scratch this model allocated.
  std::int64_t workspace_bytes() const noexcept { return workspace_bytes_; }
  const ModelSpec& spec() const noexcept { return spec_; }
  Ops& ops() const noexcept { return ops_; }

 private:
  struct Layer {
    Buffer h_mid, xn, rstd1, u, a, xm, rstd2, rlogits, probs, expert, gate, slot, row_token, xe, ue, ae, ye;
    Buffer qkv_low, attn_probs, attn_probs_low, att_low;  // GPT: attention
    Buffer packed_up, packed_down;  // discrete experts with persistent weights
  };

  Buffer make(Elem e, std::int64_t n);
  void make_moe_buffers();
  void make_gpt_buffers();
  /// The forward with its cross entropy into `loss` (index of `mb`, 0 when null).
  void forward_impl(Weights& w, Stream s, const Tensor& loss, const shardopt::MicrobatchState* mb);
  void forward_moe(Weights& w, Stream s);
  void backward_moe(Weights& w, Stream s);
  void forward_gpt(Weights& w, Stream s);
  void backward_gpt(Weights& w, Stream s);
  void head_forward(Weights& w, Stream s, const Tensor& loss, const shardopt::MicrobatchState* mb);
  void head_backward(Weights& w, Stream s);
  /// Causal self-attention of one layer: att_ (act) from L.qkv_low, via scores_.
  void attention_forward(Layer& L, Stream s);
  /// Its backward: datt_low_ (the gradient of the attention output) -> qkv_ (act).
  void attention_backward(Layer& L, Stream s);
  /// B products (one per sequence) of head-strided operands (see gpt_model.cpp).
  void head_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const Tensor& a,
                 std::int64_t lda, std::int64_t sa, const Tensor& b, std::int64_t ldb, std::int64_t sb,
                 const Tensor& c, std::int64_t ldc, std::int64_t sc, Stream s);
  /// True when parameter i is read through a compute buffer (mxfp8_params or
  /// nvfp4_params, and 2-D).
  bool decoded(int i) const;
  /// Decodes the quantized parameters `idx` (member after member, parameter after
  /// parameter) into the bf16 tensor `dst` on `s`, unless `skip` (may be null) says so on
  /// the device when the work runs (as Ops::dequantize_mxfp8).
  void decode(Weights& w, const std::vector<int>& idx, const Tensor& dst, const shardopt::MicrobatchState* skip,
              Stream s);
  /// The weights a GEMM reads for parameter i: the bf16 view, or (MXFP8) its compute
  /// buffer, refreshed on `s` when `refresh` (the forward's use; the device flag still
  /// decides) and as the forward left it otherwise (the backward's use).
  Tensor compute_weight(Weights& w, int i, Stream s, bool refresh);
  /// The G expert matrices of `idx` as one contiguous [G, ...] tensor: the grouped
  /// tensor itself, the discrete tensors packed, or (MXFP8) the members decoded -- once
  /// per step when persistent; `refresh` as in compute_weight.
  Tensor compute_experts(Weights& w, const std::vector<int>& idx, const Buffer& packed, Stream s, bool refresh);
  /// The G member gradients of an expert weight.
  std::vector<Tensor> expert_grads(Weights& w, const std::vector<int>& idx);
  void stats_and_ready(Weights& w, int i, Stream s);
  float wgrad_beta() const noexcept;

  void linear_forward(const Tensor& x, const Tensor& W, const Tensor& y, std::int64_t rows, std::int64_t in,
                      std::int64_t out, float beta, Stream s);
  void linear_dgrad(const Tensor& dy, const Tensor& W, const Tensor& dx, std::int64_t rows, std::int64_t in,
                    std::int64_t out, float beta, Stream s);
  void linear_wgrad(const Tensor& dy, const Tensor& x, const Tensor& dW, std::int64_t rows, std::int64_t in,
                    std::int64_t out, Stream s);
  /// The dense MLP of block b (GELU in the GPT, SiLU in the MoE model's dense branch):
  /// y = residual + down(act(up(x))), with u = up(x) (act) and a = act(u) (low) kept for
  /// the backward.
  void mlp_forward(Weights& w, const BlockParams& b, const Tensor& x, const Tensor& u, const Tensor& a,
                   const Tensor& residual, const Tensor& y, Stream s);
  /// Its backward: dh_ (the gradient of y) -> dx_ (of x, overwritten); the weight
  /// gradients of b.up and b.down accumulated and reported.
  void mlp_backward(Weights& w, const BlockParams& b, const Tensor& x, const Tensor& u, const Tensor& a, Stream s);
  void experts_forward(const Tensor& x, const Tensor& W, const Tensor& y, std::int64_t in, std::int64_t out, Stream s);
  void experts_dgrad(const Tensor& dy, const Tensor& W, const Tensor& dx, std::int64_t in, std::int64_t out, Stream s);
  void experts_wgrad(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& dW, std::int64_t in,
                     std::int64_t out, Stream s);

  const ModelSpec& spec_;
  Ops& ops_;
  ModelOptions opt_;
  ModelConfig c_;
  std::int64_t C_ = 0;
  std::int64_t workspace_bytes_ = 0;
  std::int64_t host_microbatch_ = 0;  // only for seed000_host_flag

  Buffer tokens_buf_, targets_buf_, links_buf_;
  std::vector<Buffer> h_;  // residual stream entering each block, and after the last
  std::vector<Layer> layers_;
  Buffer xf_, rstdf_, logits_buf_, dlogits_, token_loss_, loss_buf_, sumsq_buf_;
  Buffer dh_, dx_, dy_low_, dF_, dF_low_, dye_, dae_, due_, dxe_, dgate_, dlr_, partial_;
  Buffer shared_up_, shared_down_;  // discrete experts with gathered (FSDP) weights
  Buffer qkv_, att_, scores_, dscores_low_, dqkv_low_, datt_low_;  // GPT scratch
  Buffer eval_loss_;
  std::vector<Buffer> compute_;      // per parameter: MXFP8 / NVFP4 compute buffers (bf16), else empty
  Tensor tokens_, logits_, loss_slots_, grad_sumsq_;
};

}  // namespace trainer
