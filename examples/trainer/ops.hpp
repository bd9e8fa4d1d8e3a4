// ops.hpp - every operation of the trainer's model, behind one interface with three
// implementations:
//   * CudaOps (cuda_ops.cuh, one cuda_*.cu file per op family): CUDA kernels and cuBLAS
//     (bf16 GEMMs, fp32 accumulation);
//   * HostOps, mixed precision (host_ops.cpp): the same numerics in plain C++ on the host
//     backend (bf16 GEMM inputs, fp32 activations and accumulation), each op enqueued with
//     shardopt::host_enqueue so that a HostStream capture records it;
//   * HostOps, double precision: every tensor in double, for the gradient checks.
//
// Conventions. Matrices are row-major; a weight of a linear layer is [out, in] and the
// layer computes y = x W^T. Tensors named "act" are f32 (f64 in double precision),
// "low" are the GEMM inputs (bf16 bits; f64), "param" are parameter views (bf16; f64;
// norm weights may be f32: the 1-D parameters of an MXFP8 run stay native f32), "grad"
// are gradient views (f32 or bf16; f64). Ops that accumulate say so: every
// weight gradient is accumulated (D += ...), never overwritten, so one captured
// iteration serves every microbatch (the accumulate form D = AB + D is what is captured;
// the gradients are zeroed separately, once per step). Per-microbatch and per-step values
// are read from the device (step counter, microbatch state) when the op runs, never from
// the host, where capture would freeze the value it read into the graph.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <shardopt/backend.hpp>
#include <shardopt/fused_adam.hpp>
#include <shardopt/microbatch.hpp>
#include <shardopt/mxfp8.hpp>

#include "config.hpp"
#include "tensor.hpp"

namespace trainer {

using shardopt::Stream;

/// Numerics of an Ops implementation.
enum class Precision {
  Mixed,   ///< bf16 GEMM inputs and parameters, fp32 activations and accumulation
  Double,  ///< double everywhere (host only: gradient checks)
};

/// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, where op(A) = A^T when
/// trans_a (A stored [k,m]) and likewise for B. With batch > 1, `batch` independent
/// products at element strides stride_a/b/c. beta = 0 never reads C.
struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  Tensor a, b, c;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

/// The same product for a group of independent operands given one by one (pointer-array
/// batched GEMM): c[i] = alpha op(a[i]) op(b[i]) + beta c[i]. At most kMaxExperts.
struct GroupedGemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  std::vector<Tensor> a, b, c;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
};

/// What make_batch needs: the token stream is a pure function of (seed, rank, step,
/// microbatch, position), with the step and microbatch read from the device.
struct BatchArgs {
  const shardopt::StepScalars* scalars = nullptr;        ///< step counter (device); null: step 0
  const shardopt::MicrobatchState* microbatch = nullptr; ///< microbatch index (device); null: 0
  std::uint64_t seed = 0;
  int rank = 0;
  std::int64_t vocab = 0;
  std::int64_t tokens = 0;
  std::int64_t rule_a = 1;  ///< the task: target = (rule_a * token + rule_c) mod vocab
  std::int64_t rule_c = 0;
  std::int64_t step = 0;    ///< the step when `scalars` is null (evaluation batches)
};

/// What text_batch needs: `seqs` windows of `context` tokens from a token file (u8 tokens
/// in device memory, or the mapped file on the host backend), window j of the current
/// (step, microbatch) of this rank at math::window_start; tokens are the window, targets
/// the window shifted by one.
struct TextBatchArgs {
  const shardopt::StepScalars* scalars = nullptr;        ///< step counter (device); null: `step`
  const shardopt::MicrobatchState* microbatch = nullptr; ///< microbatch index (device); null: 0
  std::int64_t step = 0;
  std::uint64_t seed = 0;
  int rank = 0;
  std::int64_t seqs = 0, context = 0;
  const std::uint8_t* data = nullptr;
  std::int64_t data_tokens = 0;  ///< at least context + 1
};

/// Initial values of a parameter (or of a piece of one): element e of the tensor is
/// element q = offset + e of the parameter, in member m = q / member_numel; its value is
/// `constant` when is_constant, else math::init_uniform(keys[m], q % member_numel, bound).
struct InitArgs {
  std::array<std::uint64_t, kMaxExperts> keys{};
  std::int64_t member_numel = 1;
  std::int64_t offset = 0;
  float bound = 0.0f;
  float constant = 0.0f;
  bool is_constant = false;
};

/// One MXFP8 weight to decode for compute: its rowwise plane (shardopt::Mxfp8View:
/// planes.data_row and planes.scale_row) and where its members lie.
struct Mxfp8Source {
  shardopt::Mxfp8Shape shape;            ///< G members of [rows, cols]
  const std::uint8_t* data = nullptr;    ///< rowwise e4m3 data (device memory)
  const std::uint8_t* scale = nullptr;   ///< rowwise e8m0 scales, compact [G*rows, ceil(cols/32)]
  /// Device table of shape.members entries (Mxfp8View::members), read on the device when
  /// the op runs (never on the host: grouped weights need no host-side split sizes per
  /// step); null: contiguous members.
  const shardopt::Mxfp8Member* members = nullptr;
  /// Which plane `data` and `scale` are: Rowwise (scales [G*rows, ceil(cols/32)]) or
  /// Columnwise (an FSDP backward's plane; scales [G*ceil(rows/32), cols], members'
  /// scales at Mxfp8Member::scale_col_offset). The output is [G, rows, cols] either way.
  shardopt::Mxfp8Plane plane = shardopt::Mxfp8Plane::Rowwise;
};

/// Throws std::invalid_argument unless `src` (1..kMaxExperts sources, valid shapes,
/// non-null planes) fills the bf16 tensor `dst` exactly.
void check_mxfp8_sources(const std::vector<Mxfp8Source>& src, const Tensor& dst);

/// Throws std::invalid_argument unless `a` reads inside its token file (data_tokens >=
/// context + 1) and tokens / targets are i32 tensors of seqs * context elements.
void check_text_batch(const TextBatchArgs& a, const Tensor& tokens, const Tensor& targets);

/// When param_sumsq writes its slot.
enum class SumsqWhen {
  LastMicrobatch,        ///< slot = sum(x^2) on the last microbatch (accumulated grads)
  SumOverMicrobatches,   ///< slot = sum over microbatches of sum(x^2) (per-microbatch grads)
};

/// The operations. Every op is stream-ordered (enqueued on `stream`); only alloc, upload,
/// download and memory_in_use are synchronous.
class Ops {
 public:
  virtual ~Ops() = default;

  virtual shardopt::Backend backend() const noexcept = 0;
  virtual Precision precision() const noexcept = 0;
  /// Element types of activations and GEMM inputs under this precision.
  Elem act() const noexcept { return precision() == Precision::Double ? Elem::f64 : Elem::f32; }
  Elem low() const noexcept { return precision() == Precision::Double ? Elem::f64 : Elem::bf16; }

  /// The stream this Ops owns (a non-blocking cudaStream_t, or a HostStream's handle).
  virtual Stream stream() const noexcept = 0;
  /// Waits for everything queued on stream().
  virtual void synchronize() = 0;
  /// Milliseconds the work that `enqueue` queues on stream() takes (CUDA events around
  /// it; the host clock on the host backend). Synchronizes.
  virtual double time_ms(const std::function<void()>& enqueue) = 0;

  // ---- memory
  /// A zeroed buffer of `numel` elements.
  virtual Buffer alloc(Elem elem, std::int64_t numel) = 0;
  virtual void zero(const Tensor& t, Stream stream) = 0;
  /// dst = src (same element type and length).
  virtual void copy(const Tensor& dst, const Tensor& src, Stream stream) = 0;
  /// Synchronous copies between host memory and a tensor (waits for all queued work).
  virtual void upload(const Tensor& dst, const void* src) = 0;
  virtual void download(void* dst, const Tensor& src) = 0;
  /// Bytes of device memory in use on this rank's device (0 on the host backend).
  virtual std::int64_t memory_in_use() const = 0;
  /// The device's name as the driver reports it ("host" on the host backend).
  virtual std::string device_name() const = 0;

  /// Initial parameter values (see InitArgs), written on `stream`: into a bf16 (f64)
  /// parameter, or into an f32 tensor (an fp32 master piece: MXFP8 runs seed the master).
  /// The f32 values are those the bf16 ones are rounded from.
  virtual void init_param(const Tensor& t, const InitArgs& args, Stream stream) = 0;

  // ---- data
  /// tokens[t] and targets[t] (i32) of the current (step, microbatch) of this rank.
  virtual void make_batch(const BatchArgs& args, const Tensor& tokens, const Tensor& targets, Stream stream) = 0;

  /// tokens[j*context + i] = data[start_j + i], targets[...] = data[start_j + i + 1] (i32).
  virtual void text_batch(const TextBatchArgs& args, const Tensor& tokens, const Tensor& targets, Stream stream) = 0;

  // ---- GEMMs
  virtual void gemm(const GemmArgs& args, Stream stream) = 0;
  virtual void grouped_gemm(const GroupedGemmArgs& args, Stream stream) = 0;

  // ---- elementwise and row ops (T tokens, H hidden)
  /// out[t,:] = table[tokens[t],:] (param -> act).
  virtual void embed_forward(const Tensor& table, const Tensor& tokens, const Tensor& out, std::int64_t T,
                             std::int64_t H, Stream stream) = 0;
  /// dtable[v,:] += sum over t with tokens[t] == v of dout[t,:], summed in token order in
  /// the accumulation type and added once per row (deterministic). `links` is an i32
  /// scratch of T elements.
  virtual void embed_backward(const Tensor& dout, const Tensor& tokens, const Tensor& links, const Tensor& dtable,
                              std::int64_t T, std::int64_t H, Stream stream) = 0;
  /// y = x * rstd * w with rstd[t] = 1 / sqrt(mean(x[t,:]^2) + eps) (act, param -> low, act;
  /// w bf16 or f32 in mixed precision, likewise in rmsnorm_backward).
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t T,
                               std::int64_t H, float eps, Stream stream) = 0;
  /// dx += d(rmsnorm)/dx given dy (the gradient of y), and dw += sum_t dy * x * rstd.
  /// `partial` is an act scratch of rmsnorm_partial_size(T, H) elements.
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                const Tensor& dx, const Tensor& dw, const Tensor& partial, std::int64_t T,
                                std::int64_t H, Stream stream) = 0;
  /// a = silu(u) (act -> low).
  virtual void silu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream stream) = 0;
  /// du = da * silu'(u) (act, act -> low).
  virtual void silu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream stream) = 0;
  /// y = x rounded to the GEMM-input type (act -> low).
  virtual void to_low(const Tensor& x, const Tensor& y, std::int64_t n, Stream stream) = 0;

  // ---- GPT (S = context length, T = sequences * S)
  /// h[t,:] += table[t % S,:] (param, act).
  virtual void pos_embed_forward(const Tensor& table, const Tensor& h, std::int64_t T, std::int64_t S, std::int64_t H,
                                 Stream stream) = 0;
  /// dtable[p,:] += sum over sequences b (in order) of dh[b*S + p,:].
  virtual void pos_embed_backward(const Tensor& dh, const Tensor& dtable, std::int64_t T, std::int64_t S,
                                  std::int64_t H, Stream stream) = 0;
  /// a = gelu(u) (act -> low); du = da * gelu'(u) (act, act -> low).
  virtual void gelu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream stream) = 0;
  virtual void gelu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream stream) = 0;
  /// For each of `blocks` S x S score matrices (act): probs[i,j] = softmax over j <= i of
  /// scores[i,:], 0 for j > i (causal); probs (act) and probs_low (low) hold it.
  virtual void causal_softmax_forward(const Tensor& scores, const Tensor& probs, const Tensor& probs_low,
                                      std::int64_t blocks, std::int64_t S, Stream stream) = 0;
  /// dscores[i,j] = probs[i,j] * (dprobs[i,j] - sum_k probs[i,k] dprobs[i,k]) (-> low; 0
  /// above the diagonal).
  virtual void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores,
                                       std::int64_t blocks, std::int64_t S, Stream stream) = 0;

  // ---- mixture of experts (G experts, capacity C)
  /// probs = softmax(logits) per token; expert = argmax (first on ties); gate = its prob.
  virtual void router_forward(const Tensor& logits, const Tensor& probs, const Tensor& expert, const Tensor& gate,
                              std::int64_t T, int G, Stream stream) = 0;
  /// dlogits[t,j] = dgate[t] * gate[t] * ([j == expert] - probs[t,j]) (-> low).
  virtual void router_backward(const Tensor& dgate, const Tensor& probs, const Tensor& expert, const Tensor& dlogits,
                               std::int64_t T, int G, Stream stream) = 0;
  /// Slots in token order per expert: slot[t] = position of t among the tokens routed to
  /// its expert, or -1 when that is >= C (dropped). row_token[g*C + s] = the token in
  /// slot s of expert g, or -1 (padding). xe[g*C + s, :] = x[row_token, :] or zeros.
  virtual void dispatch(const Tensor& expert, const Tensor& x, const Tensor& slot, const Tensor& row_token,
                        const Tensor& xe, std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream stream) = 0;
  /// h[t,:] += gate[t] * ye[expert[t]*C + slot[t], :] for kept tokens.
  virtual void combine_forward(const Tensor& ye, const Tensor& expert, const Tensor& slot, const Tensor& gate,
                               const Tensor& h, std::int64_t T, std::int64_t H, std::int64_t C, Stream stream) = 0;
  /// dye[r,:] = gate[t] * dh[t,:] for the token t of row r (zeros for padding rows, -> low);
  /// dgate[t] = dot(dh[t,:], ye[row of t,:]) (0 for dropped tokens).
  virtual void combine_backward(const Tensor& dh, const Tensor& ye, const Tensor& expert, const Tensor& slot,
                                const Tensor& gate, const Tensor& row_token, const Tensor& dye, const Tensor& dgate,
                                std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream stream) = 0;
  /// dx[t,:] = dxe[row of t,:] for kept tokens, zeros for dropped ones (overwrites dx).
  virtual void dispatch_backward(const Tensor& dxe, const Tensor& expert, const Tensor& slot, const Tensor& dx,
                                 std::int64_t T, std::int64_t H, std::int64_t C, Stream stream) = 0;

  // ---- loss
  /// Cross entropy of logits [T,V] against targets: token_loss[t] = lse - logit[target];
  /// loss_slots[microbatch index] = mean_t token_loss (index read from the device; 0 when
  /// `microbatch` is null); dlogits = grad_scale * (softmax - onehot) (-> low).
  virtual void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                             const Tensor& token_loss, const Tensor& loss_slots,
                             const shardopt::MicrobatchState* microbatch, float grad_scale, std::int64_t T,
                             std::int64_t V, Stream stream) = 0;

  // ---- weights for compute, gradient statistics
  /// dst[i*n .. (i+1)*n) = src[i] for every source of n elements each, unless `skip` is
  /// non-null and skip->skip_weight_update is set on the device when the op runs.
  virtual void pack(const std::vector<Tensor>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
                    Stream stream) = 0;
  /// dst (bf16) = the rowwise planes of `src` decoded (math::mxfp8_to_bf16: bitwise bf16 of
  /// shardopt::dequantize_mxfp8's f32 values), member after member, source after source,
  /// unless `skip` is non-null and skip->skip_weight_update is set on the device when the
  /// op runs (one captured op serves every microbatch and decodes on the first; a host
  /// flag would be frozen at capture).
  /// One launch; mixed precision only (check_mxfp8_sources says what it takes).
  virtual void dequantize_mxfp8(const std::vector<Mxfp8Source>& src, const Tensor& dst,
                                const shardopt::MicrobatchState* skip, Stream stream) = 0;
  /// slot[0] (act) = sum of squares of x (accumulated in f32/f64 in a fixed order), written
  /// as `when` says from the device microbatch state (null: always overwrite).
  virtual void sumsq(const Tensor& x, const Tensor& slot, const shardopt::MicrobatchState* microbatch, SumsqWhen when,
                     Stream stream) = 0;
};

/// Elements of the rmsnorm_backward scratch for T x H.
std::int64_t rmsnorm_partial_size(std::int64_t T, std::int64_t H);

/// The host implementation (mixed precision: the host backend's model; double: checks).
std::unique_ptr<Ops> make_host_ops(Precision precision);

/// The CUDA implementation on the current device; throws std::runtime_error when the
/// trainer was built without CUDA.
std::unique_ptr<Ops> make_cuda_ops();

/// True when this trainer was built with its CUDA ops.
bool cuda_ops_built() noexcept;

}  // namespace trainer
