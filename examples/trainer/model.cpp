#include "model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include <shardopt/nvfp4.hpp>

#include "op_math.hpp"

namespace trainer {

Model::Model(const ModelSpec& spec, Ops& ops, ModelOptions options)
    : spec_(spec), ops_(ops), opt_(options), c_(spec.config()), C_(spec.config().capacity()) {
  if (opt_.microbatches < 1) throw std::invalid_argument("microbatches must be at least 1");
  opt_.batch.vocab = c_.vocab;
  opt_.batch.tokens = c_.tokens;
  opt_.batch.rule_a = rule_multiplier(c_.vocab);
  opt_.batch.rule_c = kRuleOffset;
  tokens_buf_ = make(Elem::i32, c_.tokens);
  targets_buf_ = make(Elem::i32, c_.tokens);
  links_buf_ = make(Elem::i32, c_.tokens);
  for (int l = 0; l <= c_.layers; ++l) h_.push_back(make(ops.act(), c_.tokens * c_.hidden));
  if (c_.gpt)
    make_gpt_buffers();
  else
    make_moe_buffers();
  if (opt_.mxfp8_params && opt_.nvfp4_params)
    throw std::invalid_argument("ModelOptions: mxfp8_params and nvfp4_params exclude each other");
  if (opt_.mxfp8_params || opt_.nvfp4_params) {
    const char* fmt = opt_.mxfp8_params ? "MXFP8" : "NVFP4";
    if (opt_.gathered_weights && opt_.nvfp4_params)
      throw std::invalid_argument("ModelOptions: NVFP4 parameters are persistent (DistributedAdam), not gathered "
                                  "per use");
    if (ops.precision() != Precision::Mixed)
      throw std::invalid_argument(std::string("ModelOptions: ") + fmt + " parameters need mixed precision");
    // One bf16 compute buffer per quantized parameter; discrete experts decode into the
    // per-layer packed buffers instead.
    compute_.resize(static_cast<std::size_t>(spec.num_params()));
    for (int i = 0; i < spec.num_params(); ++i) {
      const ParamInfo& p = spec.params()[static_cast<std::size_t>(i)];
      const bool discrete_expert = p.expert >= 0;
      if (decoded(i) && !discrete_expert)
        compute_[static_cast<std::size_t>(i)] = make(ops.low(), shardopt::numel(p.shape) * p.members);
    }
  }
  const std::int64_t T = c_.tokens, H = c_.hidden, F = c_.mlp, V = c_.vocab;
  const Elem act = ops.act(), low = ops.low();
  xf_ = make(low, T * H);
  rstdf_ = make(act, T);
  logits_buf_ = make(act, T * V);
  dlogits_ = make(low, T * V);
  token_loss_ = make(act, T);
  loss_buf_ = make(act, opt_.microbatches);
  eval_loss_ = make(act, 1);
  sumsq_buf_ = make(act, spec.num_params());
  dh_ = make(act, T * H);
  dx_ = make(act, T * H);
  dy_low_ = make(low, T * H);
  dF_ = make(act, T * F);
  dF_low_ = make(low, T * F);
  partial_ = make(act, rmsnorm_partial_size(T, H));
  tokens_ = tokens_buf_.get();
  logits_ = logits_buf_.get();
  loss_slots_ = loss_buf_.get();
  grad_sumsq_ = sumsq_buf_.get();
}

void Model::make_moe_buffers() {
  const std::int64_t T = c_.tokens, H = c_.hidden, F = c_.mlp, E = c_.expert_mlp;
  const std::int64_t G = c_.experts, rows = G * C_;
  const Elem act = ops_.act(), low = ops_.low(), i32 = Elem::i32;
  for (int l = 0; l < c_.layers; ++l) {
    Layer L;
    L.h_mid = make(act, T * H);
    L.xn = make(low, T * H);
    L.rstd1 = make(act, T);
    L.u = make(act, T * F);
    L.a = make(low, T * F);
    L.xm = make(low, T * H);
    L.rstd2 = make(act, T);
    L.rlogits = make(act, T * G);
    L.probs = make(act, T * G);
    L.expert = make(i32, T);
    L.gate = make(act, T);
    L.slot = make(i32, T);
    L.row_token = make(i32, rows);
    L.xe = make(low, rows * H);
    L.ue = make(act, rows * E);
    L.ae = make(low, rows * E);
    L.ye = make(act, rows * H);
    if (spec_.discrete_experts() && !opt_.gathered_weights) {
      L.packed_up = make(low, G * E * H);
      L.packed_down = make(low, G * H * E);
    }
    layers_.push_back(std::move(L));
  }
  if (spec_.discrete_experts() && opt_.gathered_weights) {
    shared_up_ = make(low, G * E * H);
    shared_down_ = make(low, G * H * E);
  }
  dye_ = make(low, rows * H);
  dae_ = make(act, rows * E);
  due_ = make(low, rows * E);
  dxe_ = make(act, rows * H);
  dgate_ = make(act, T);
  dlr_ = make(low, T * G);
}

Buffer Model::make(Elem e, std::int64_t n) {
  Buffer b = ops_.alloc(e, n);
  workspace_bytes_ += static_cast<std::int64_t>(b.get().bytes());
  return b;
}

void Model::set_batch(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets) {
  if (static_cast<std::int64_t>(tokens.size()) != c_.tokens || tokens.size() != targets.size())
    throw std::invalid_argument("set_batch needs tokens and targets of the model's tokens per microbatch");
  ops_.upload(tokens_buf_, tokens.data());
  ops_.upload(targets_buf_, targets.data());
}

void Model::microbatch(Weights& w, Stream s) {
  make_batch(s);
  forward(w, s);
  backward(w, s);
  ++host_microbatch_;
}

void Model::make_batch(Stream s) {
  if (!opt_.generate_batch) return;
  if (opt_.text != nullptr) {
    TextBatchArgs a;
    a.scalars = opt_.batch.scalars;
    a.microbatch = opt_.batch.microbatch;
    a.seed = opt_.batch.seed;
    a.rank = opt_.batch.rank;
    a.context = c_.gpt ? c_.context : c_.tokens;
    a.seqs = c_.tokens / a.context;
    a.data = opt_.text;
    a.data_tokens = opt_.text_tokens;
    ops_.text_batch(a, tokens_buf_, targets_buf_, s);
    return;
  }
  ops_.make_batch(opt_.batch, tokens_buf_, targets_buf_, s);
}

void Model::make_eval_batch(std::int64_t index, const std::uint8_t* val, std::int64_t val_tokens, Stream s) {
  // Another seed than training's, the evaluation index as the step, microbatch 0.
  const std::uint64_t seed = opt_.batch.seed ^ 0xE7A15EEDull;
  if (val != nullptr) {
    TextBatchArgs a;
    a.step = index;
    a.seed = seed;
    a.rank = opt_.batch.rank;
    a.context = c_.gpt ? c_.context : c_.tokens;
    a.seqs = c_.tokens / a.context;
    a.data = val;
    a.data_tokens = val_tokens;
    ops_.text_batch(a, tokens_buf_, targets_buf_, s);
    return;
  }
  BatchArgs a = opt_.batch;
  a.scalars = nullptr;
  a.microbatch = nullptr;
  a.step = index;
  a.seed = seed;
  ops_.make_batch(a, tokens_buf_, targets_buf_, s);
}

void Model::eval_forward(Weights& w, Stream s) {
  refresh_weights(w, s);
  forward_impl(w, s, eval_loss_.get(), nullptr);
  w.end_forward_only(s);
}

void Model::forward(Weights& w, Stream s) { forward_impl(w, s, loss_slots_, opt_.microbatch); }

void Model::forward_impl(Weights& w, Stream s, const Tensor& loss, const shardopt::MicrobatchState* mb) {
  if (c_.gpt)
    forward_gpt(w, s);
  else
    forward_moe(w, s);
  head_forward(w, s, loss, mb);
}

void Model::backward(Weights& w, Stream s) {
  head_backward(w, s);
  if (c_.gpt)
    backward_gpt(w, s);
  else
    backward_moe(w, s);
}

void Model::head_forward(Weights& w, Stream s, const Tensor& loss, const shardopt::MicrobatchState* mb) {
  const std::int64_t T = c_.tokens, H = c_.hidden, V = c_.vocab;
  const int N = c_.layers;
  w.forward_unit(N + 1, s);
  ops_.rmsnorm_forward(h_[static_cast<std::size_t>(N)], w.param(spec_.final_norm()), xf_, rstdf_, T, H,
                       math::kNormEps, s);
  linear_forward(xf_, compute_weight(w, spec_.head(), s, true), logits_, T, H, V, 0.0f, s);
  const float scale = 1.0f / static_cast<float>(T * opt_.microbatches);
  ops_.cross_entropy(logits_, targets_buf_, dlogits_, token_loss_, loss, mb, scale, T, V, s);
}

void Model::head_backward(Weights& w, Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, V = c_.vocab;
  const int N = c_.layers;
  w.backward_unit(N + 1, true, s);
  linear_wgrad(dlogits_, xf_, w.grad(spec_.head()), T, H, V, s);
  stats_and_ready(w, spec_.head(), s);
  linear_dgrad(dlogits_, compute_weight(w, spec_.head(), s, false), dx_, T, H, V, 0.0f, s);
  ops_.zero(dh_, s);
  ops_.rmsnorm_backward(dx_, h_[static_cast<std::size_t>(N)], w.param(spec_.final_norm()), rstdf_, dh_,
                        w.grad(spec_.final_norm()), partial_, T, H, s);
  stats_and_ready(w, spec_.final_norm(), s);
  w.backward_unit_done(N + 1, s);
}

float Model::wgrad_beta() const noexcept {
  if (!opt_.seed000_host_flag) return 1.0f;
  return host_microbatch_ % opt_.microbatches == 0 ? 0.0f : 1.0f;
}

bool Model::decoded(int i) const {
  return (opt_.mxfp8_params || opt_.nvfp4_params) && spec_.params()[static_cast<std::size_t>(i)].shape.size() >= 2;
}

namespace {

void check_format(Weights& w, int i, bool decoded, const ModelSpec& spec, bool nvfp4) {
  const bool stored = nvfp4 ? w.is_nvfp4(i) : w.is_mxfp8(i);
  const char* fmt = nvfp4 ? "NVFP4" : "MXFP8";
  if (stored != decoded)
    throw std::logic_error("'" + spec.params()[static_cast<std::size_t>(i)].name + "' is " + (stored ? "" : "not ") +
                           fmt + " in the optimizer but the model was built " + (decoded ? "with" : "without") +
                           " ModelOptions::" + (nvfp4 ? "nvfp4_params" : "mxfp8_params"));
}

}  // namespace

void Model::decode(Weights& w, const std::vector<int>& idx, const Tensor& dst, const shardopt::MicrobatchState* skip,
                   Stream s) {
  if (opt_.mxfp8_params) {
    std::vector<Mxfp8Source> src;
    for (int i : idx) src.push_back(w.mxfp8(i));
    ops_.dequantize_mxfp8(src, dst, skip, s);
    return;
  }
  // NVFP4: the library's batched decode, every member of every weight in one launch
  // (bf16, nearest even, of e2m1 * (float(scale) * decode_scale)), skipped on the device
  // as the MXFP8 op is; Hopper has no NVFP4 GEMM either.
  std::vector<shardopt::Nvfp4Decode> list;
  std::int64_t at = 0;
  for (int i : idx) {
    const shardopt::Nvfp4View v = w.nvfp4(i);
    for (std::int64_t g = 0; g < v.members; ++g) {
      const shardopt::Nvfp4Planes m = v.member(g);
      if (at + v.shape.numel() > dst.numel) throw std::logic_error("Model::decode: the NVFP4 weights overflow dst");
      list.push_back({v.shape, m.data, m.scale, m.decode_scale, static_cast<std::uint16_t*>(dst.data) + at});
      at += v.shape.numel();
    }
  }
  if (at != dst.numel) throw std::logic_error("Model::decode: the NVFP4 weights do not fill dst");
  if (list.empty()) return;  // nothing to decode (the batch refuses an empty list)
  shardopt::dequantize_nvfp4_batch(list, skip != nullptr ? &skip->skip_weight_update : nullptr, ops_.backend(), s);
}

Tensor Model::compute_weight(Weights& w, int i, Stream s, bool refresh) {
  check_format(w, i, decoded(i), spec_, opt_.nvfp4_params);
  if (!decoded(i)) return w.param(i);  // bf16 parameters are read as they are
  // MXFP8: Hopper has no MXFP8 GEMM, so the rowwise plane is decoded to bf16 once per step
  // (the weights change only at the step): on the first microbatch, decided on the device
  // (skip_weight_update), never by a host flag, which capture would freeze into the graph.
  // Gathered MXFP8 weights (FSDP) are decoded on every use, from the plane of the pass:
  // rowwise in forward, columnwise for the backward's data-gradient GEMM.
  const Tensor& dst = compute_[static_cast<std::size_t>(i)].get();
  if (opt_.gathered_weights) {
    decode(w, {i}, dst, nullptr, s);
  } else if (refresh) {
    decode(w, {i}, dst, opt_.microbatch, s);
  }
  return dst;
}

Tensor Model::compute_experts(Weights& w, const std::vector<int>& idx, const Buffer& packed, Stream s, bool refresh) {
  for (int i : idx) check_format(w, i, decoded(i), spec_, opt_.nvfp4_params);
  if (!spec_.discrete_experts()) return compute_weight(w, idx.front(), s, refresh);  // the grouped tensor
  if (w.persistent() == opt_.gathered_weights)
    throw std::logic_error(opt_.gathered_weights ? "ModelOptions::gathered_weights is set, but these weights persist"
                                                 : "these weights are gathered per use (FSDP): set "
                                                   "ModelOptions::gathered_weights");
  const Tensor& dst = packed.get();
  if (!refresh && !opt_.gathered_weights) return dst;  // packed by this step's first forward
  // Persistent weights change only at the step: pack (or decode) on the first microbatch,
  // reuse on the others, deciding on the device (skip_weight_update), never by a host flag
  // frozen at capture. Gathered weights are packed on every use.
  if (opt_.mxfp8_params || opt_.nvfp4_params) {
    decode(w, idx, dst, opt_.gathered_weights ? nullptr : opt_.microbatch, s);
    return dst;
  }
  std::vector<Tensor> src;
  for (int i : idx) src.push_back(w.param(i));
  ops_.pack(src, dst, opt_.gathered_weights ? nullptr : opt_.microbatch, s);
  return dst;
}

void Model::refresh_weights(Weights& w, Stream s) {
  if (opt_.gathered_weights) return;
  for (int i = 0; i < spec_.num_params(); ++i) {
    check_format(w, i, decoded(i), spec_, opt_.nvfp4_params);
    if (decoded(i) && spec_.params()[static_cast<std::size_t>(i)].expert < 0)
      decode(w, {i}, compute_[static_cast<std::size_t>(i)].get(), nullptr, s);
  }
  if (!spec_.discrete_experts()) return;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const BlockParams& b = spec_.blocks()[l];
    const Layer& L = layers_[l];
    for (const auto& [idx, packed] : {std::pair{&b.expert_up, &L.packed_up}, std::pair{&b.expert_down, &L.packed_down}}) {
      if (opt_.mxfp8_params || opt_.nvfp4_params) {
        decode(w, *idx, packed->get(), nullptr, s);
      } else {
        std::vector<Tensor> src;
        for (int i : *idx) src.push_back(w.param(i));
        ops_.pack(src, packed->get(), nullptr, s);
      }
    }
  }
}

Tensor Model::compute_buffer(int i, int member) const {
  if (!decoded(i))
    throw std::logic_error("compute_buffer: parameter " + std::to_string(i) + " is not decoded from MXFP8 or NVFP4");
  const ParamInfo& p = spec_.params()[static_cast<std::size_t>(i)];
  const std::int64_t n = shardopt::numel(p.shape);
  if (p.expert >= 0) {  // a discrete expert: its slice of the layer's packed buffer
    if (member > 0) throw std::out_of_range("compute_buffer: a discrete expert has no members");
    const Layer& L = layers_[static_cast<std::size_t>(p.layer)];
    const Buffer& packed = p.kind == ParamKind::ExpertUp ? L.packed_up : L.packed_down;
    return packed.get().slice(p.expert * n, n);
  }
  const Tensor whole = compute_[static_cast<std::size_t>(i)].get();
  if (member < 0) return whole;
  if (member >= p.members) throw std::out_of_range("compute_buffer: no member " + std::to_string(member));
  return whole.slice(member * n, n);
}

std::vector<Tensor> Model::expert_grads(Weights& w, const std::vector<int>& idx) {
  std::vector<Tensor> out;
  if (!spec_.discrete_experts()) {
    for (int g = 0; g < c_.experts; ++g) out.push_back(w.grad(idx.front(), g));
  } else {
    for (int i : idx) out.push_back(w.grad(i));
  }
  return out;
}

void Model::stats_and_ready(Weights& w, int i, Stream s) {
  if (opt_.grad_stats) ops_.sumsq(w.grad(i), grad_sumsq_.slice(i, 1), opt_.microbatch, w.sumsq_when(), s);
  w.grad_done(i, s);
}

void Model::linear_forward(const Tensor& x, const Tensor& W, const Tensor& y, std::int64_t rows, std::int64_t in,
                           std::int64_t out, float beta, Stream s) {
  GemmArgs g;
  g.trans_b = true;
  g.m = rows, g.n = out, g.k = in;
  g.a = x, g.lda = in;
  g.b = W, g.ldb = in;
  g.c = y, g.ldc = out;
  g.beta = beta;
  ops_.gemm(g, s);
}

void Model::linear_dgrad(const Tensor& dy, const Tensor& W, const Tensor& dx, std::int64_t rows, std::int64_t in,
                         std::int64_t out, float beta, Stream s) {
  GemmArgs g;
  g.m = rows, g.n = in, g.k = out;
  g.a = dy, g.lda = out;
  g.b = W, g.ldb = in;
  g.c = dx, g.ldc = in;
  g.beta = beta;
  ops_.gemm(g, s);
}

void Model::linear_wgrad(const Tensor& dy, const Tensor& x, const Tensor& dW, std::int64_t rows, std::int64_t in,
                         std::int64_t out, Stream s) {
  GemmArgs g;
  g.trans_a = true;
  g.m = out, g.n = in, g.k = rows;
  g.a = dy, g.lda = out;
  g.b = x, g.ldb = in;
  g.c = dW, g.ldc = in;
  g.beta = wgrad_beta();
  ops_.gemm(g, s);
}

void Model::mlp_forward(Weights& w, const BlockParams& b, const Tensor& x, const Tensor& u, const Tensor& a,
                        const Tensor& residual, const Tensor& y, Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, F = c_.mlp;
  linear_forward(x, compute_weight(w, b.up, s, true), u, T, H, F, 0.0f, s);
  if (c_.gpt)
    ops_.gelu_forward(u, a, T * F, s);
  else
    ops_.silu_forward(u, a, T * F, s);
  ops_.copy(y, residual, s);
  linear_forward(a, compute_weight(w, b.down, s, true), y, T, F, H, 1.0f, s);
}

void Model::mlp_backward(Weights& w, const BlockParams& b, const Tensor& x, const Tensor& u, const Tensor& a,
                         Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, F = c_.mlp;
  ops_.to_low(dh_, dy_low_, T * H, s);
  linear_wgrad(dy_low_, a, w.grad(b.down), T, F, H, s);
  linear_dgrad(dy_low_, compute_weight(w, b.down, s, false), dF_, T, F, H, 0.0f, s);
  stats_and_ready(w, b.down, s);
  if (c_.gpt)
    ops_.gelu_backward(dF_, u, dF_low_, T * F, s);
  else
    ops_.silu_backward(dF_, u, dF_low_, T * F, s);
  linear_wgrad(dF_low_, x, w.grad(b.up), T, H, F, s);
  linear_dgrad(dF_low_, compute_weight(w, b.up, s, false), dx_, T, H, F, 0.0f, s);
  stats_and_ready(w, b.up, s);
}

void Model::experts_forward(const Tensor& x, const Tensor& W, const Tensor& y, std::int64_t in, std::int64_t out,
                            Stream s) {
  GemmArgs g;
  g.trans_b = true;
  g.m = C_, g.n = out, g.k = in;
  g.a = x, g.lda = in;
  g.b = W, g.ldb = in;
  g.c = y, g.ldc = out;
  g.batch = c_.experts;
  g.stride_a = C_ * in, g.stride_b = out * in, g.stride_c = C_ * out;
  ops_.gemm(g, s);
}

void Model::experts_dgrad(const Tensor& dy, const Tensor& W, const Tensor& dx, std::int64_t in, std::int64_t out,
                          Stream s) {
  GemmArgs g;
  g.m = C_, g.n = in, g.k = out;
  g.a = dy, g.lda = out;
  g.b = W, g.ldb = in;
  g.c = dx, g.ldc = in;
  g.batch = c_.experts;
  g.stride_a = C_ * out, g.stride_b = out * in, g.stride_c = C_ * in;
  ops_.gemm(g, s);
}

void Model::experts_wgrad(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& dW, std::int64_t in,
                          std::int64_t out, Stream s) {
  // Pointer-array batched GEMM in both expert modes: discrete gradient views are not
  // equally strided, and issuing the same call either way keeps the two modes bitwise equal.
  GroupedGemmArgs g;
  g.trans_a = true;
  g.m = out, g.n = in, g.k = C_;
  g.lda = out, g.ldb = in, g.ldc = in;
  g.beta = wgrad_beta();
  for (int e = 0; e < c_.experts; ++e) {
    g.a.push_back(dy.slice(e * C_ * out, C_ * out));
    g.b.push_back(x.slice(e * C_ * in, C_ * in));
    g.c.push_back(dW[static_cast<std::size_t>(e)]);
  }
  ops_.grouped_gemm(g, s);
}

void Model::forward_moe(Weights& w, Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, E = c_.expert_mlp;
  const int G = c_.experts, N = c_.layers;
  const float eps = math::kNormEps;
  w.forward_unit(0, s);
  ops_.embed_forward(compute_weight(w, spec_.embed(), s, true), tokens_, h_[0], T, H, s);
  for (int l = 0; l < N; ++l) {
    const BlockParams& b = spec_.blocks()[static_cast<std::size_t>(l)];
    Layer& L = layers_[static_cast<std::size_t>(l)];
    w.forward_unit(l + 1, s);
    // Dense branch: h_mid = h + down(silu(up(norm1(h)))).
    ops_.rmsnorm_forward(h_[static_cast<std::size_t>(l)], w.param(b.norm1), L.xn, L.rstd1, T, H, eps, s);
    mlp_forward(w, b, L.xn, L.u, L.a, h_[static_cast<std::size_t>(l)], L.h_mid, s);
    // MoE branch: h_out = h_mid + gate * expert(norm2(h_mid)), top-1, fixed capacity.
    ops_.rmsnorm_forward(L.h_mid, w.param(b.norm2), L.xm, L.rstd2, T, H, eps, s);
    linear_forward(L.xm, compute_weight(w, b.router, s, true), L.rlogits, T, H, G, 0.0f, s);
    ops_.router_forward(L.rlogits, L.probs, L.expert, L.gate, T, G, s);
    ops_.dispatch(L.expert, L.xm, L.slot, L.row_token, L.xe, T, H, G, C_, s);
    const Tensor wu = compute_experts(w, b.expert_up, opt_.gathered_weights ? shared_up_ : L.packed_up, s, true);
    experts_forward(L.xe, wu, L.ue, H, E, s);
    ops_.silu_forward(L.ue, L.ae, G * C_ * E, s);
    const Tensor wd = compute_experts(w, b.expert_down, opt_.gathered_weights ? shared_down_ : L.packed_down, s, true);
    experts_forward(L.ae, wd, L.ye, E, H, s);
    ops_.copy(h_[static_cast<std::size_t>(l) + 1], L.h_mid, s);
    ops_.combine_forward(L.ye, L.expert, L.slot, L.gate, h_[static_cast<std::size_t>(l) + 1], T, H, C_, s);
  }
}

void Model::backward_moe(Weights& w, Stream s) {
  const std::int64_t T = c_.tokens, H = c_.hidden, E = c_.expert_mlp;
  const int G = c_.experts, N = c_.layers;

  for (int l = N - 1; l >= 0; --l) {
    const BlockParams& b = spec_.blocks()[static_cast<std::size_t>(l)];
    Layer& L = layers_[static_cast<std::size_t>(l)];
    w.backward_unit(l + 1, true, s);
    // MoE branch (dh holds the gradient of the block's output).
    ops_.combine_backward(dh_, L.ye, L.expert, L.slot, L.gate, L.row_token, dye_, dgate_, T, H, G, C_, s);
    // Gathered weights are packed again (the shared buffer served other layers since);
    // persistent ones are what this step's first forward prepared.
    const Tensor wd = compute_experts(w, b.expert_down, opt_.gathered_weights ? shared_down_ : L.packed_down, s,
                                      opt_.gathered_weights);
    experts_wgrad(dye_, L.ae, expert_grads(w, b.expert_down), E, H, s);
    experts_dgrad(dye_, wd, dae_, E, H, s);
    for (int i : b.expert_down) stats_and_ready(w, i, s);
    ops_.silu_backward(dae_, L.ue, due_, G * C_ * E, s);
    const Tensor wu = compute_experts(w, b.expert_up, opt_.gathered_weights ? shared_up_ : L.packed_up, s,
                                      opt_.gathered_weights);
    experts_wgrad(due_, L.xe, expert_grads(w, b.expert_up), H, E, s);
    experts_dgrad(due_, wu, dxe_, H, E, s);
    for (int i : b.expert_up) stats_and_ready(w, i, s);
    ops_.dispatch_backward(dxe_, L.expert, L.slot, dx_, T, H, C_, s);
    ops_.router_backward(dgate_, L.probs, L.expert, dlr_, T, G, s);
    linear_wgrad(dlr_, L.xm, w.grad(b.router), T, H, G, s);
    linear_dgrad(dlr_, compute_weight(w, b.router, s, false), dx_, T, H, G, 1.0f, s);
    stats_and_ready(w, b.router, s);
    ops_.rmsnorm_backward(dx_, L.h_mid, w.param(b.norm2), L.rstd2, dh_, w.grad(b.norm2), partial_, T, H, s);
    stats_and_ready(w, b.norm2, s);
    // Dense branch.
    mlp_backward(w, b, L.xn, L.u, L.a, s);
    ops_.rmsnorm_backward(dx_, h_[static_cast<std::size_t>(l)], w.param(b.norm1), L.rstd1, dh_, w.grad(b.norm1),
                          partial_, T, H, s);
    stats_and_ready(w, b.norm1, s);
    w.backward_unit_done(l + 1, s);
  }

  // Embedding: its backward needs no parameters (no gather in FSDP).
  w.backward_unit(0, false, s);
  ops_.embed_backward(dh_, tokens_, links_buf_, w.grad(spec_.embed()), T, H, s);
  stats_and_ready(w, spec_.embed(), s);
  w.backward_unit_done(0, s);
}

}  // namespace trainer
