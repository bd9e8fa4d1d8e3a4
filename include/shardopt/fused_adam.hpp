// shardopt/fused_adam.hpp - the capturable fused Adam/AdamW step over a rank's flat
// shard, and the gradient-norm kernels that feed it.
//
// Everything that changes from step to step (step count, learning rate, loss scale,
// clip coefficient, found-inf) is read from a StepScalars in device memory, so one
// captured launch serves every step. A shard is walked through a table of chunks (each
// a contiguous piece of one parameter inside one bucket slice); the number of launches
// is constant however many parameters the shard holds.
//
// Numerics (fp32, as torch.optim.AdamW / Adam): g = (grad * inv_loss_scale) * clip_coef;
// AdamW: p *= 1 - lr*wd first; Adam: g += wd*p; m = lerp(m, g, 1-b1);
// v = b2 v + (1-b2) g^2; p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// Scalar factors (bias corrections, 1 - lr*wd, lr / bc1) are formed in double and
// rounded to fp32 once, as PyTorch does with its Python-float hyper-parameters; the
// element operations follow torch's CUDA kernels operation by operation (see
// src/kernels/adam/adam_math.cuh). The CUDA kernels and their host twins share this element
// math and round identically (bitwise).
#pragma once

#include <cstdint>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/muon.hpp"

namespace shardopt {

/// Elements of one parameter that share a scale in 8-bit moments (DType::q8_block): the
/// blocks start at the parameter's first element, so a shard that starts on a block
/// boundary of every parameter it holds updates them exactly as an unsharded run would.
inline constexpr std::int64_t kMomentBlock = 256;

/// Largest number of optimizer groups one launch takes.
inline constexpr int kMaxAdamGroups = 8;

/// Blocks of the first pass of accumulate_grad_sumsq; fixed (not tied to the device) so
/// that the summation order, hence the result, is the same on every GPU and on the host.
inline constexpr int kGradNormBlocks = 1024;

/// Device-resident per-step values (nothing per-step lives on the host). Written only by
/// kernels and by copies
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
  std::int32_t found_inf = 0;  ///< nonzero: skip the step, nothing changes (an optimizer's
                               ///< step() clears it with the norm fields, then recomputes it)
  float step_size = 0.0f;      ///< derived by the prologue: lr / (1 - beta1^step)
  float bc2_sqrt = 1.0f;       ///< derived by the prologue: sqrt(1 - beta2^step)
  /// Derived by the prologue for each optimizer group g (lr_g = lr * lr_scale[g]):
  /// lr_g / (1 - beta1^step) and the decoupled decay factor 1 - lr_g * wd[g] (1 for Adam).
  float group_step_size[kMaxAdamGroups] = {};
  float group_decay[kMaxAdamGroups] = {};
  /// Scratch of accumulate_grad_sumsq (per-block partial sums and non-finite counts);
  /// meaningless between calls.
  float norm_partials[2 * kGradNormBlocks] = {};
};

/// One contiguous piece of a shard: `length` elements of one parameter.
struct ShardChunk {
  std::int64_t shard_offset = 0;   ///< index into master
  std::int64_t buffer_offset = 0;  ///< index into the grad and param buffers
  std::int64_t length = 0;
  std::int32_t group = 0;          ///< optimizer group (AdamConfig::groups)
  std::int32_t pad_ = 0;
  /// The moments sit at shard_offset - moment_shift (>= 0, <= shard_offset): optimizers
  /// with Muon groups keep compact moment arrays that leave the Muon pieces out. Vector
  /// accesses need it to be a multiple of the vector width (16 always is).
  std::int64_t moment_shift = 0;
};

/// `pieces` (contiguous pieces of a shard, each within one parameter, of any length)
/// split into chunks of at most `max_chunk` elements (> 0, else Error(InvalidArgument)),
/// in order. shard_chunks (shardopt/layout.hpp) builds a layout's table with it.
std::vector<ShardChunk> split_shard_chunks(const std::vector<ShardChunk>& pieces, std::int64_t max_chunk);

/// Hyper-parameters of one optimizer group. Doubles, like PyTorch's Python floats: the
/// derived fp32 factors (1 - lr*wd, lr / bc1) are formed in double and rounded once.
struct AdamGroup {
  double weight_decay = 0.0;
  double lr_scale = 1.0;  ///< this group's lr = StepScalars::lr * lr_scale
  /// AdamW (the fused Adam step) or Muon (shardopt/muon.hpp, docs/muon.md: 2-D and
  /// grouped parameters only; weight_decay above is then unused, muon.weight_decay applies).
  GroupAlgorithm algorithm = GroupAlgorithm::AdamW;
  MuonSettings muon{};  ///< Muon's settings; read only when algorithm is Muon
};

/// How the optimizer keeps the fp32 master copy of its parameters.
enum class MasterStorage : std::uint8_t {
  /// A full fp32 copy of every parameter's shard: 4 bytes per element.
  fp32,
  /// bf16 parameters keep no fp32 copy: the bf16 parameter plus a 16-bit remainder rebuild
  /// the fp32 master exactly (2 bytes per element). The parameter is the master rounded to
  /// the nearest bf16 with ties away from zero, not to even: on an exact tie above an even
  /// bf16 it is one bf16 step higher than an fp32-master run's (docs/state_precision.md).
  /// Parameters of other dtypes, MXFP8 / NVFP4 parameters and Muon groups keep fp32.
  bf16_remainder,
};

/// "fp32" or "bf16_remainder".
const char* to_string(MasterStorage m) noexcept;

/// Constant configuration of a fused Adam launch. beta1, beta2 and eps are doubles as in
/// PyTorch (0.999 is not 0.999f: 1 - 0.999f differs from 0.001 by 1.3e-5 relative);
/// the kernels use float(beta2), float(1 - beta1), float(1 - beta2) and float(eps).
struct AdamConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool decoupled_weight_decay = true;  ///< true: AdamW; false: Adam with L2 in the gradient
  DType grad_dtype = DType::f32;       ///< f32 main grads, or bf16 / f16 read directly
  DType param_dtype = DType::bf16;     ///< model-param output written in the same pass
  bool write_params = true;            ///< false: update the master only
  /// f32, bf16, or q8_block: 8-bit codes plus one fp32 scale per kMomentBlock elements in
  /// ShardPointers::exp_avg_scales / exp_avg_sq_scales (docs/state_precision.md).
  DType moment_dtype = DType::f32;
  /// bf16_remainder: the master is the bf16 param plus ShardPointers::remainders (needs
  /// write_params and param_dtype bf16); ShardPointers::master is not used.
  MasterStorage master_storage = MasterStorage::fp32;
  std::vector<AdamGroup> groups{AdamGroup{}};
};

/// Device pointers of one shard, as the kernels walk it. Base pointers should be 16-byte
/// aligned (every allocation of shardopt is); otherwise the kernels fall back to scalar
/// accesses. A chunk's vector body needs shard_offset == buffer_offset modulo the
/// vector width (4 elements with only fp32 arrays, 8 with a 2-byte array); chunks that
/// are not so aligned are processed with scalar accesses, correctly but slower.
struct ShardPointers {
  const ShardChunk* chunks = nullptr;  ///< device array of num_chunks entries
  std::int64_t num_chunks = 0;
  std::int64_t shard_numel = 0;        ///< length of master (and of the moments unless moment_numel)
  std::int64_t moment_numel = 0;       ///< length of exp_avg / exp_avg_sq; 0: shard_numel
  const void* grads = nullptr;         ///< grad buffer base (grad_dtype), by buffer_offset
  void* params = nullptr;              ///< param buffer base (param_dtype), by buffer_offset
  float* master = nullptr;             ///< fp32 master, by shard_offset (MasterStorage::fp32)
  std::uint16_t* remainders = nullptr; ///< the masters' low halves, by shard_offset (bf16_remainder)
  void* exp_avg = nullptr;             ///< first moment (moment_dtype), by shard_offset - moment_shift
  void* exp_avg_sq = nullptr;          ///< second moment (moment_dtype), by shard_offset - moment_shift
  /// q8_block moments: the scales of exp_avg and exp_avg_sq, one float per block of
  /// kMomentBlock moment elements (moment index / kMomentBlock). Every chunk's first moment
  /// index (shard_offset - moment_shift) must then be a multiple of kMomentBlock, and a
  /// chunk shorter than a multiple of it ends its parameter (the rest of that block is
  /// padding no chunk holds).
  float* exp_avg_scales = nullptr;
  float* exp_avg_sq_scales = nullptr;
};

/// One Adam step over the shard: a one-thread prologue (if found_inf is clear: step += 1
/// and derive step_size, bc2_sqrt, group_step_size and group_decay) and the main pass,
/// two launches whatever the shard holds. With found_inf set nothing is written (params,
/// master, moments, step, derived values). Capturable: all per-step values are read from
/// `scalars` when the kernels run. Throws Error(InvalidArgument) for a bad config
/// (groups empty or more than kMaxAdamGroups, moment dtype not f32/bf16/q8_block, ...) or
/// missing pointers; chunk group indices must be < config.groups.size().
void fused_adam_step(const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                     Backend backend, Stream stream);

/// The two halves of fused_adam_step, for several buffers that share one StepScalars
/// (one step counter): call adam_step_prologue once per step, then adam_step_apply once
/// per buffer, all with the same betas and groups. fused_adam_step(c, s, x) is exactly
/// adam_step_prologue(c, x) followed by adam_step_apply(c, s, x).
void adam_step_prologue(const AdamConfig& config, StepScalars* scalars, Backend backend, Stream stream);
/// The main pass of the step over one shard (one launch; none for an empty shard).
void adam_step_apply(const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                     Backend backend, Stream stream);

/// Sum of squares of the shard's gradients (fp32, deterministic) added to
/// scalars->grad_sumsq, and 1.0f added to scalars->nonfinite if an element is NaN/Inf.
/// Reads shard.chunks, shard.num_chunks and shard.grads only. Call once per buffer;
/// combining across ranks is the caller's (one Sum all-reduce of the two adjacent
/// floats). Two launches (kGradNormBlocks partial sums in a fixed order, then one block
/// that adds them in a fixed tree): bitwise the same result on every run, on every
/// device and on the host twin. Capturable. Calls on one StepScalars must be ordered
/// (they share its scratch).
void accumulate_grad_sumsq(DType grad_dtype, const ShardPointers& shard, StepScalars* scalars,
                           Backend backend, Stream stream);

/// From the combined grad_sumsq: grad_norm = sqrt(sumsq) * inv_loss_scale; found_inf
/// |= (nonfinite > 0 || !finite(norm)); clip_coef = max_norm > 0 ? min(1, max_norm / (norm + 1e-6)) : 1.
/// One thread; capturable.
void finalize_grad_norm(float max_norm, StepScalars* scalars, Backend backend, Stream stream);

}  // namespace shardopt
