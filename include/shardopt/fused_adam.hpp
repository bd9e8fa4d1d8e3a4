// shardopt/fused_adam.hpp - the capturable fused Adam/AdamW step over a rank's flat
// shard, and the gradient-norm kernels that feed it.
//
// Everything that changes from step to step (step count, learning rate, loss scale,
// clip coefficient, found-inf) is read from a StepScalars in device memory, so one
// captured launch serves every step. A shard is walked through a table of chunks (each
// a contiguous piece of one parameter inside one bucket slice); the number of launches
// is constant however many parameters the shard holds.
//
// Numerics (fp32, as torch.optim.AdamW / Adam): g = grad * inv_loss_scale * clip_coef;
// AdamW: p -= lr*wd*p first; Adam: g += wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps). The CUDA kernels and
// their host twins share this element math and round identically.
#pragma once

#include <cstdint>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"

namespace shardopt {

class Layout;

/// Device-resident per-step values (contract 3). Written only by kernels and by copies
/// captured from pinned host slots; never read by the host inside a step.
struct StepScalars {
  std::int64_t step = 0;       ///< steps applied so far; the Adam prologue increments it
  float lr = 0.0f;             ///< learning rate of this step (each group scales it)
  float inv_loss_scale = 1.0f; ///< gradients are multiplied by this first
  float clip_coef = 1.0f;      ///< global-norm clip coefficient min(1, max/(norm+1e-6))
  float grad_sumsq = 0.0f;     ///< sum of squares of the raw gradients (all ranks once combined)
  float nonfinite = 0.0f;      ///< > 0 when a gradient element was NaN/Inf; next to grad_sumsq so
                               ///< that one Sum all-reduce of these two floats combines ranks
  float grad_norm = 0.0f;      ///< global norm of the unscaled gradients
  std::int32_t found_inf = 0;  ///< nonzero: skip the step, nothing changes
  float step_size = 0.0f;      ///< derived by the prologue: lr / (1 - beta1^step)
  float bc2_sqrt = 1.0f;       ///< derived by the prologue: sqrt(1 - beta2^step)
};

/// One contiguous piece of a shard: `length` elements of one parameter.
struct ShardChunk {
  std::int64_t shard_offset = 0;   ///< index into master / moments
  std::int64_t buffer_offset = 0;  ///< index into the grad and param buffers
  std::int64_t length = 0;
  std::int32_t group = 0;          ///< optimizer group (AdamConfig::groups)
  std::int32_t pad_ = 0;
};

/// The chunks of rank `rank`'s shard of layout buffer `buffer`, each at most
/// `max_chunk` elements, in shard order (padding is in no chunk).
std::vector<ShardChunk> shard_chunks(const Layout& layout, int buffer, int rank,
                                     std::int64_t max_chunk = 1 << 16);

/// Hyper-parameters of one optimizer group.
struct AdamGroup {
  float weight_decay = 0.0f;
  float lr_scale = 1.0f;  ///< this group's lr = StepScalars::lr * lr_scale
};

/// Largest number of optimizer groups one launch takes.
inline constexpr int kMaxAdamGroups = 8;

/// Constant configuration of a fused Adam launch.
struct AdamConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  bool decoupled_weight_decay = true;  ///< true: AdamW; false: Adam with L2 in the gradient
  DType grad_dtype = DType::f32;       ///< f32 main grads, or bf16 / f16 read directly
  DType param_dtype = DType::bf16;     ///< model-param output written in the same pass
  bool write_params = true;            ///< false: update the master only
  DType moment_dtype = DType::f32;     ///< f32, or bf16 moments (see tests for accuracy)
  std::vector<AdamGroup> groups{AdamGroup{}};
};

/// Device pointers of one shard, as the kernels walk it.
struct ShardPointers {
  const ShardChunk* chunks = nullptr;  ///< device array of num_chunks entries
  std::int64_t num_chunks = 0;
  std::int64_t shard_numel = 0;        ///< length of master and moments
  const void* grads = nullptr;         ///< grad buffer base (grad_dtype), by buffer_offset
  void* params = nullptr;              ///< param buffer base (param_dtype), by buffer_offset
  float* master = nullptr;             ///< fp32 master, by shard_offset
  void* exp_avg = nullptr;             ///< first moment (moment_dtype), by shard_offset
  void* exp_avg_sq = nullptr;          ///< second moment (moment_dtype), by shard_offset
};

/// One Adam step over the shard: a one-thread prologue (if found_inf is clear: step += 1
/// and derive step_size and bc2_sqrt) and the main pass. With found_inf set nothing is
/// written (params, master, moments, step). Constant launches; capturable.
void fused_adam_step(const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                     Backend backend, Stream stream);

/// The two halves of fused_adam_step, for a step that updates several shards (one per
/// layout buffer) under one step count: the prologue once, then the update per shard.
void adam_prologue(const AdamConfig& config, StepScalars* scalars, Backend backend, Stream stream);
void adam_update(const AdamConfig& config, const ShardPointers& shard, const StepScalars* scalars,
                 Backend backend, Stream stream);

/// Sum of squares of the shard's gradients (fp32, deterministic) added to
/// scalars->grad_sumsq, and 1.0f added to scalars->nonfinite if an element is NaN/Inf.
/// Call once per buffer; combining across ranks is the caller's (one Sum all-reduce of
/// the two adjacent floats). Capturable.
void accumulate_grad_sumsq(DType grad_dtype, const ShardPointers& shard, StepScalars* scalars,
                           Backend backend, Stream stream);

/// From the combined grad_sumsq: grad_norm = sqrt(sumsq) * inv_loss_scale; found_inf
/// |= (nonfinite > 0 || !finite(norm)); clip_coef = max_norm > 0 ? min(1, max_norm / (norm + 1e-6)) : 1.
/// One thread; capturable.
void finalize_grad_norm(float max_norm, StepScalars* scalars, Backend backend, Stream stream);

}  // namespace shardopt
