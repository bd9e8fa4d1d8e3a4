// host_ops.cpp - Ops on the host: the templates of host_ops.hpp instantiated for the
// tensors' element types, each op enqueued with shardopt::host_enqueue (so a HostStream
// capture records it, with its arguments by value, and a replay runs it again reading
// the device-side step and microbatch state afresh).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include <shardopt/host_stream.hpp>

#include "gpt_host_ops.hpp"
#include "host_ops.hpp"

namespace trainer {

const char* to_string(Elem e) noexcept {
  switch (e) {
    case Elem::f32: return "f32";
    case Elem::bf16: return "bf16";
    case Elem::f64: return "f64";
    case Elem::i32: return "i32";
    case Elem::u8: return "u8";
  }
  return "?";
}

Tensor from_view(const shardopt::TensorView& v) {
  Tensor t;
  t.data = v.data;
  t.numel = v.numel();
  switch (v.dtype) {
    case shardopt::DType::f32: t.elem = Elem::f32; break;
    case shardopt::DType::bf16: t.elem = Elem::bf16; break;
    default:
      throw std::invalid_argument(std::string("the trainer takes bf16 or f32 views, not ") + shardopt::to_string(v.dtype));
  }
  return t;
}

std::int64_t rmsnorm_partial_size(std::int64_t T, std::int64_t H) { return std::min<std::int64_t>(T, 64) * H; }

void check_mxfp8_sources(const std::vector<Mxfp8Source>& src, const Tensor& dst) {
  if (src.empty() || src.size() > static_cast<std::size_t>(kMaxExperts))
    throw std::invalid_argument("dequantize_mxfp8: 1.." + std::to_string(kMaxExperts) + " sources, not " +
                                std::to_string(src.size()));
  if (dst.elem != Elem::bf16) throw std::invalid_argument("dequantize_mxfp8: the output is bf16");
  std::int64_t total = 0;
  for (const Mxfp8Source& x : src) {
    shardopt::validate(x.shape);
    if (x.data == nullptr || x.scale == nullptr)
      throw std::invalid_argument("dequantize_mxfp8: a source without its rowwise data or scales");
    total += x.shape.numel();
  }
  if (total != dst.numel)
    throw std::invalid_argument("dequantize_mxfp8: the sources hold " + std::to_string(total) +
                                " elements, the output " + std::to_string(dst.numel));
}

void check_text_batch(const TextBatchArgs& a, const Tensor& tokens, const Tensor& targets) {
  if (a.data == nullptr || a.seqs < 1 || a.context < 1 || a.data_tokens < a.context + 1)
    throw std::invalid_argument("text_batch: a token file of " + std::to_string(a.data_tokens) +
                                " tokens has no window of " + std::to_string(a.context) + " + 1 tokens");
  if (tokens.elem != Elem::i32 || targets.elem != Elem::i32 || tokens.numel != a.seqs * a.context ||
      targets.numel != tokens.numel)
    throw std::invalid_argument("text_batch: tokens and targets are i32 tensors of seqs * context elements");
}

namespace {

using host::Bf16;

[[noreturn]] void bad_types(const char* op, std::initializer_list<Elem> elems) {
  std::string s = std::string("host ops: ") + op + " does not take element types";
  for (Elem e : elems) s += std::string(" ") + to_string(e);
  throw std::invalid_argument(s);
}

class HostOps final : public Ops {
 public:
  explicit HostOps(Precision p) : precision_(p) {}

  shardopt::Backend backend() const noexcept override { return shardopt::Backend::Host; }
  Precision precision() const noexcept override { return precision_; }

  Stream stream() const noexcept override { return stream_.handle(); }
  void synchronize() override { shardopt::synchronize(shardopt::Backend::Host, stream_.handle()); }
  double time_ms(const std::function<void()>& enqueue) override {
    const auto t0 = std::chrono::steady_clock::now();
    enqueue();
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::milli>(t1 - t0).count();
  }

  Buffer alloc(Elem elem, std::int64_t numel) override {
    const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(numel) * elem_size(elem), 64);
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return Buffer(Tensor{p, elem, numel}, [](void* q) { std::free(q); });
  }
  void zero(const Tensor& t, Stream s) override {
    shardopt::host_enqueue(s, [t] { std::memset(t.data, 0, t.bytes()); });
  }
  void copy(const Tensor& dst, const Tensor& src, Stream s) override {
    if (dst.elem != src.elem || dst.numel != src.numel) throw std::invalid_argument("copy: tensors differ in type or length");
    shardopt::host_enqueue(s, [dst, src] { std::memcpy(dst.data, src.data, dst.bytes()); });
  }
  void upload(const Tensor& dst, const void* src) override { std::memcpy(dst.data, src, dst.bytes()); }
  void download(void* dst, const Tensor& src) override { std::memcpy(dst, src.data, src.bytes()); }
  std::int64_t memory_in_use() const override { return 0; }
  std::string device_name() const override { return "host"; }

  void init_param(const Tensor& t, const InitArgs& a, Stream s) override {
    const bool ok = mixed() ? (t.elem == Elem::bf16 || t.elem == Elem::f32) : t.elem == Elem::f64;
    if (!ok) bad_types("init_param", {t.elem});
    shardopt::host_enqueue(s, [t, a] {
      for (std::int64_t e = 0; e < t.numel; ++e) {
        const std::int64_t q = a.offset + e;
        const float v = a.is_constant ? a.constant
                                      : math::init_uniform(a.keys[static_cast<std::size_t>(q / a.member_numel)],
                                                           q % a.member_numel, a.bound);
        if (t.elem == Elem::f64)
          t.as<double>()[e] = v;
        else if (t.elem == Elem::f32)
          t.as<float>()[e] = v;
        else
          t.as<std::uint16_t>()[e] = math::to_bf16(v);
      }
    });
  }

  void make_batch(const BatchArgs& a, const Tensor& tokens, const Tensor& targets, Stream s) override {
    shardopt::host_enqueue(s, [a, tokens, targets] {
      const std::int64_t step = a.scalars != nullptr ? a.scalars->step : a.step;
      const std::int32_t mb = a.microbatch != nullptr ? a.microbatch->index : 0;
      for (std::int64_t t = 0; t < a.tokens; ++t) {
        const std::int32_t x = math::token_at(a.seed, a.rank, step, mb, t, a.vocab);
        tokens.as<std::int32_t>()[t] = x;
        targets.as<std::int32_t>()[t] = math::target_of(x, a.rule_a, a.rule_c, a.vocab);
      }
    });
  }

  void text_batch(const TextBatchArgs& a, const Tensor& tokens, const Tensor& targets, Stream s) override {
    check_text_batch(a, tokens, targets);
    shardopt::host_enqueue(s, [a, tokens, targets] {
      const std::int64_t step = a.scalars != nullptr ? a.scalars->step : a.step;
      const std::int32_t mb = a.microbatch != nullptr ? a.microbatch->index : 0;
      host::text_batch(a, step, mb, tokens.as<std::int32_t>(), targets.as<std::int32_t>());
    });
  }

  void pos_embed_forward(const Tensor& table, const Tensor& h, std::int64_t T, std::int64_t S, std::int64_t H,
                         Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (!mixed())
        host::pos_embed_forward(table.as<double>(), h.as<double>(), T, S, H);
      else if (table.elem == Elem::f32)
        host::pos_embed_forward(table.as<float>(), h.as<float>(), T, S, H);
      else
        host::pos_embed_forward(table.as<Bf16>(), h.as<float>(), T, S, H);
    });
  }

  void pos_embed_backward(const Tensor& dh, const Tensor& dtable, std::int64_t T, std::int64_t S, std::int64_t H,
                          Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (!mixed())
        host::pos_embed_backward(dh.as<double>(), dtable.as<double>(), T, S, H);
      else if (dtable.elem == Elem::f32)
        host::pos_embed_backward(dh.as<float>(), dtable.as<float>(), T, S, H);
      else
        host::pos_embed_backward(dh.as<float>(), dtable.as<Bf16>(), T, S, H);
    });
  }

  void gelu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::gelu_forward(u.as<float>(), a.as<Bf16>(), n);
      else
        host::gelu_forward(u.as<double>(), a.as<double>(), n);
    });
  }

  void gelu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::gelu_backward(da.as<float>(), u.as<float>(), du.as<Bf16>(), n);
      else
        host::gelu_backward(da.as<double>(), u.as<double>(), du.as<double>(), n);
    });
  }

  void causal_softmax_forward(const Tensor& scores, const Tensor& probs, const Tensor& probs_low, std::int64_t blocks,
                              std::int64_t S, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::causal_softmax_forward(scores.as<float>(), probs.as<float>(), probs_low.as<Bf16>(), blocks, S);
      else
        host::causal_softmax_forward(scores.as<double>(), probs.as<double>(), probs_low.as<double>(), blocks, S);
    });
  }

  void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores, std::int64_t blocks,
                               std::int64_t S, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::causal_softmax_backward(dprobs.as<float>(), probs.as<float>(), dscores.as<Bf16>(), blocks, S);
      else
        host::causal_softmax_backward(dprobs.as<double>(), probs.as<double>(), dscores.as<double>(), blocks, S);
    });
  }

  void gemm(const GemmArgs& g, Stream s) override {
    check_gemm("gemm", g.a, g.b, g.c);
    shardopt::host_enqueue(s, [g, this] {
      for (int i = 0; i < g.batch; ++i)
        one_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.a.slice(i * g.stride_a, 0), g.lda,
                 g.b.slice(i * g.stride_b, 0), g.ldb, g.beta, g.c.slice(i * g.stride_c, 0), g.ldc);
    });
  }

  void grouped_gemm(const GroupedGemmArgs& g, Stream s) override {
    if (g.a.size() != g.b.size() || g.a.size() != g.c.size() || g.a.size() > static_cast<std::size_t>(kMaxExperts))
      throw std::invalid_argument("grouped_gemm: a, b and c need the same number of operands (at most kMaxExperts)");
    for (std::size_t i = 0; i < g.a.size(); ++i) check_gemm("grouped_gemm", g.a[i], g.b[i], g.c[i]);
    shardopt::host_enqueue(s, [g, this] {
      for (std::size_t i = 0; i < g.a.size(); ++i)
        one_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.a[i], g.lda, g.b[i], g.ldb, g.beta, g.c[i], g.ldc);
    });
  }

  void embed_forward(const Tensor& table, const Tensor& tokens, const Tensor& out, std::int64_t T, std::int64_t H,
                     Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::embed_forward(table.as<Bf16>(), tokens.as<std::int32_t>(), out.as<float>(), T, H);
      else
        host::embed_forward(table.as<double>(), tokens.as<std::int32_t>(), out.as<double>(), T, H);
    });
  }

  void embed_backward(const Tensor& dout, const Tensor& tokens, const Tensor& links, const Tensor& dtable,
                      std::int64_t T, std::int64_t H, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      const auto* tok = tokens.as<std::int32_t>();
      auto* ln = links.as<std::int32_t>();
      if (!mixed())
        host::embed_backward(dout.as<double>(), tok, ln, dtable.as<double>(), T, H);
      else if (dtable.elem == Elem::f32)
        host::embed_backward(dout.as<float>(), tok, ln, dtable.as<float>(), T, H);
      else
        host::embed_backward(dout.as<float>(), tok, ln, dtable.as<Bf16>(), T, H);
    });
  }

  void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t T,
                       std::int64_t H, float eps, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed() && w.elem == Elem::f32)
        host::rmsnorm_forward(x.as<float>(), w.as<float>(), y.as<Bf16>(), rstd.as<float>(), T, H, eps);
      else if (mixed())
        host::rmsnorm_forward(x.as<float>(), w.as<Bf16>(), y.as<Bf16>(), rstd.as<float>(), T, H, eps);
      else
        host::rmsnorm_forward(x.as<double>(), w.as<double>(), y.as<double>(), rstd.as<double>(), T, H, eps);
    });
  }

  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw, const Tensor& /*partial*/, std::int64_t T, std::int64_t H,
                        Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (!mixed())
        host::rmsnorm_backward(dy.as<double>(), x.as<double>(), w.as<double>(), rstd.as<double>(), dx.as<double>(),
                               dw.as<double>(), T, H);
      else if (w.elem == Elem::f32 && dw.elem == Elem::f32)
        host::rmsnorm_backward(dy.as<float>(), x.as<float>(), w.as<float>(), rstd.as<float>(), dx.as<float>(),
                               dw.as<float>(), T, H);
      else if (w.elem == Elem::f32)
        host::rmsnorm_backward(dy.as<float>(), x.as<float>(), w.as<float>(), rstd.as<float>(), dx.as<float>(),
                               dw.as<Bf16>(), T, H);
      else if (dw.elem == Elem::f32)
        host::rmsnorm_backward(dy.as<float>(), x.as<float>(), w.as<Bf16>(), rstd.as<float>(), dx.as<float>(),
                               dw.as<float>(), T, H);
      else
        host::rmsnorm_backward(dy.as<float>(), x.as<float>(), w.as<Bf16>(), rstd.as<float>(), dx.as<float>(),
                               dw.as<Bf16>(), T, H);
    });
  }

  void silu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::silu_forward(u.as<float>(), a.as<Bf16>(), n);
      else
        host::silu_forward(u.as<double>(), a.as<double>(), n);
    });
  }

  void silu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::silu_backward(da.as<float>(), u.as<float>(), du.as<Bf16>(), n);
      else
        host::silu_backward(da.as<double>(), u.as<double>(), du.as<double>(), n);
    });
  }

  void to_low(const Tensor& x, const Tensor& y, std::int64_t n, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::to_low(x.as<float>(), y.as<Bf16>(), n);
      else
        host::to_low(x.as<double>(), y.as<double>(), n);
    });
  }

  void router_forward(const Tensor& logits, const Tensor& probs, const Tensor& expert, const Tensor& gate,
                      std::int64_t T, int G, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::router_forward(logits.as<float>(), probs.as<float>(), expert.as<std::int32_t>(), gate.as<float>(), T, G);
      else
        host::router_forward(logits.as<double>(), probs.as<double>(), expert.as<std::int32_t>(), gate.as<double>(), T,
                             G);
    });
  }

  void router_backward(const Tensor& dgate, const Tensor& probs, const Tensor& expert, const Tensor& dlogits,
                       std::int64_t T, int G, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::router_backward(dgate.as<float>(), probs.as<float>(), expert.as<std::int32_t>(), dlogits.as<Bf16>(), T,
                              G);
      else
        host::router_backward(dgate.as<double>(), probs.as<double>(), expert.as<std::int32_t>(),
                              dlogits.as<double>(), T, G);
    });
  }

  void dispatch(const Tensor& expert, const Tensor& x, const Tensor& slot, const Tensor& row_token, const Tensor& xe,
                std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::dispatch(expert.as<std::int32_t>(), x.as<Bf16>(), slot.as<std::int32_t>(), row_token.as<std::int32_t>(),
                       xe.as<Bf16>(), T, H, G, C);
      else
        host::dispatch(expert.as<std::int32_t>(), x.as<double>(), slot.as<std::int32_t>(),
                       row_token.as<std::int32_t>(), xe.as<double>(), T, H, G, C);
    });
  }

  void combine_forward(const Tensor& ye, const Tensor& expert, const Tensor& slot, const Tensor& gate, const Tensor& h,
                       std::int64_t T, std::int64_t H, std::int64_t C, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::combine_forward(ye.as<float>(), expert.as<std::int32_t>(), slot.as<std::int32_t>(), gate.as<float>(),
                              h.as<float>(), T, H, C);
      else
        host::combine_forward(ye.as<double>(), expert.as<std::int32_t>(), slot.as<std::int32_t>(), gate.as<double>(),
                              h.as<double>(), T, H, C);
    });
  }

  void combine_backward(const Tensor& dh, const Tensor& ye, const Tensor& expert, const Tensor& slot,
                        const Tensor& gate, const Tensor& row_token, const Tensor& dye, const Tensor& dgate,
                        std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::combine_backward(dh.as<float>(), ye.as<float>(), expert.as<std::int32_t>(), slot.as<std::int32_t>(),
                               gate.as<float>(), row_token.as<std::int32_t>(), dye.as<Bf16>(), dgate.as<float>(), T, H,
                               G, C);
      else
        host::combine_backward(dh.as<double>(), ye.as<double>(), expert.as<std::int32_t>(), slot.as<std::int32_t>(),
                               gate.as<double>(), row_token.as<std::int32_t>(), dye.as<double>(), dgate.as<double>(),
                               T, H, G, C);
    });
  }

  void dispatch_backward(const Tensor& dxe, const Tensor& expert, const Tensor& slot, const Tensor& dx,
                         std::int64_t T, std::int64_t H, std::int64_t C, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      if (mixed())
        host::dispatch_backward(dxe.as<float>(), expert.as<std::int32_t>(), slot.as<std::int32_t>(), dx.as<float>(), T,
                                H, C);
      else
        host::dispatch_backward(dxe.as<double>(), expert.as<std::int32_t>(), slot.as<std::int32_t>(), dx.as<double>(),
                                T, H, C);
    });
  }

  void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& token_loss,
                     const Tensor& loss_slots, const shardopt::MicrobatchState* mb, float grad_scale, std::int64_t T,
                     std::int64_t V, Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      const std::int32_t index = mb != nullptr ? mb->index : 0;
      if (mixed())
        host::cross_entropy(logits.as<float>(), targets.as<std::int32_t>(), dlogits.as<Bf16>(), token_loss.as<float>(),
                            loss_slots.as<float>() + index, grad_scale, T, V);
      else
        host::cross_entropy(logits.as<double>(), targets.as<std::int32_t>(), dlogits.as<double>(),
                            token_loss.as<double>(), loss_slots.as<double>() + index, static_cast<double>(grad_scale),
                            T, V);
    });
  }

  void pack(const std::vector<Tensor>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
            Stream s) override {
    shardopt::host_enqueue(s, [src, dst, skip] {
      if (skip != nullptr && skip->skip_weight_update != 0) return;
      char* out = static_cast<char*>(dst.data);
      for (const Tensor& t : src) {
        std::memcpy(out, t.data, t.bytes());
        out += t.bytes();
      }
    });
  }

  void dequantize_mxfp8(const std::vector<Mxfp8Source>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
                        Stream s) override {
    if (!mixed()) throw std::invalid_argument("host ops: dequantize_mxfp8 is a mixed-precision op");
    check_mxfp8_sources(src, dst);
    shardopt::host_enqueue(s, [src, dst, skip] {
      if (skip != nullptr && skip->skip_weight_update != 0) return;
      std::uint16_t* out = dst.as<std::uint16_t>();
      for (const Mxfp8Source& x : src) {
        const shardopt::Mxfp8Shape& sh = x.shape;
        for (std::int64_t g = 0; g < sh.members; ++g) {
          // The member table is read when the op runs, as the kernel reads it.
          const std::int64_t data_at = x.members != nullptr ? x.members[g].element_offset : g * sh.member_numel();
          const bool col = x.plane == shardopt::Mxfp8Plane::Columnwise;
          const std::int64_t scale_at =
              x.members != nullptr ? (col ? x.members[g].scale_col_offset : x.members[g].scale_row_offset)
                                   : (col ? g * sh.col_blocks() * sh.cols : g * sh.rows * sh.row_blocks());
          for (std::int64_t r = 0; r < sh.rows; ++r)
            for (std::int64_t c = 0; c < sh.cols; ++c)
              out[g * sh.member_numel() + r * sh.cols + c] = math::mxfp8_to_bf16(
                  x.data[data_at + r * sh.cols + c],
                  x.scale[scale_at + (col ? (r / shardopt::kMxfp8Block) * sh.cols + c
                                          : r * sh.row_blocks() + c / shardopt::kMxfp8Block)]);
        }
        out += sh.numel();
      }
    });
  }

  void sumsq(const Tensor& x, const Tensor& slot, const shardopt::MicrobatchState* mb, SumsqWhen when,
             Stream s) override {
    shardopt::host_enqueue(s, [=, this] {
      const bool write = mb == nullptr || when == SumsqWhen::SumOverMicrobatches || mb->last != 0;
      if (!write) return;
      const bool add = mb != nullptr && when == SumsqWhen::SumOverMicrobatches && mb->first == 0;
      if (!mixed()) {
        const double v = host::sum_of_squares<double, double>(x.as<double>(), x.numel);
        slot.as<double>()[0] = add ? slot.as<double>()[0] + v : v;
        return;
      }
      const float v = x.elem == Elem::f32 ? host::sum_of_squares<float, float>(x.as<float>(), x.numel)
                                          : host::sum_of_squares<Bf16, float>(x.as<Bf16>(), x.numel);
      slot.as<float>()[0] = add ? slot.as<float>()[0] + v : v;
    });
  }

 private:
  bool mixed() const noexcept { return precision_ == Precision::Mixed; }

  void check_gemm(const char* op, const Tensor& a, const Tensor& b, const Tensor& c) const {
    const bool ok = mixed() ? (a.elem == Elem::bf16 && b.elem == Elem::bf16 && (c.elem == Elem::f32 || c.elem == Elem::bf16))
                            : (a.elem == Elem::f64 && b.elem == Elem::f64 && c.elem == Elem::f64);
    if (!ok) bad_types(op, {a.elem, b.elem, c.elem});
  }

  void one_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const Tensor& a,
                std::int64_t lda, const Tensor& b, std::int64_t ldb, float beta, const Tensor& c,
                std::int64_t ldc) const {
    if (!mixed()) {
      host::gemm<double>(ta, tb, m, n, k, alpha, a.as<double>(), lda, b.as<double>(), ldb, beta, c.as<double>(), ldc);
    } else if (c.elem == Elem::f32) {
      host::gemm<float>(ta, tb, m, n, k, alpha, a.as<Bf16>(), lda, b.as<Bf16>(), ldb, beta, c.as<float>(), ldc);
    } else {
      host::gemm<float>(ta, tb, m, n, k, alpha, a.as<Bf16>(), lda, b.as<Bf16>(), ldb, beta, c.as<Bf16>(), ldc);
    }
  }

  Precision precision_;
  shardopt::HostStream stream_;
};

}  // namespace

std::unique_ptr<Ops> make_host_ops(Precision precision) { return std::make_unique<HostOps>(precision); }

}  // namespace trainer
