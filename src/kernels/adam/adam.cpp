// adam.cpp - the public fused Adam entry points: validation, splitting a shard's
// pieces into chunks, and dispatch to the CUDA kernels or the host twin.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/check.hpp"
#include "kernels/adam/adam_amax.hpp"
#include "kernels/adam/adam_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

namespace shardopt {
namespace {

using kernels::AdamApplyLaunch;
using kernels::AdamApplyParams;
using kernels::AdamPrologueParams;
using kernels::AdamVariant;

void check_config(const AdamConfig& c) {
  const auto n = c.groups.size();
  SHARDOPT_REQUIRE(n >= 1 && n <= static_cast<std::size_t>(kMaxAdamGroups), ErrorCode::InvalidArgument,
                   "AdamConfig::groups has " + std::to_string(n) + " entries; give between 1 and " +
                       std::to_string(kMaxAdamGroups) + " optimizer groups");
  SHARDOPT_REQUIRE(c.beta1 >= 0.0 && c.beta1 < 1.0 && c.beta2 >= 0.0 && c.beta2 < 1.0, ErrorCode::InvalidArgument,
                   "AdamConfig betas must lie in [0, 1); got beta1=" + std::to_string(c.beta1) +
                       ", beta2=" + std::to_string(c.beta2));
  SHARDOPT_REQUIRE(std::isfinite(c.eps) && c.eps >= 0.0, ErrorCode::InvalidArgument,
                   "AdamConfig::eps must be finite and >= 0");
  for (std::size_t g = 0; g < n; ++g) {
    SHARDOPT_REQUIRE(std::isfinite(c.groups[g].weight_decay) && std::isfinite(c.groups[g].lr_scale),
                     ErrorCode::InvalidArgument,
                     "AdamConfig::groups[" + std::to_string(g) + "] has a non-finite weight_decay or lr_scale");
  }
  SHARDOPT_REQUIRE(is_float_storage(c.grad_dtype), ErrorCode::InvalidArgument,
                   std::string("AdamConfig::grad_dtype is ") + to_string(c.grad_dtype) + "; use f32, bf16 or f16");
  SHARDOPT_REQUIRE(c.moment_dtype == DType::f32 || c.moment_dtype == DType::bf16 || c.moment_dtype == DType::q8_block,
                   ErrorCode::InvalidArgument,
                   std::string("AdamConfig::moment_dtype is ") + to_string(c.moment_dtype) + "; use f32, bf16 or q8_block");
  SHARDOPT_REQUIRE(!c.write_params || is_float_storage(c.param_dtype), ErrorCode::InvalidArgument,
                   std::string("AdamConfig::param_dtype is ") + to_string(c.param_dtype) +
                       "; use f32, bf16 or f16, or set write_params = false");
  SHARDOPT_REQUIRE(c.master_storage == MasterStorage::fp32 ||
                       (c.master_storage == MasterStorage::bf16_remainder && c.write_params &&
                        c.param_dtype == DType::bf16),
                   ErrorCode::InvalidArgument,
                   std::string("AdamConfig::master_storage is ") + to_string(c.master_storage) +
                       ", which needs write_params = true and param_dtype bf16 (the master is the bf16 parameter "
                       "plus its remainder); param_dtype is " + to_string(c.param_dtype) +
                       (c.write_params ? "" : " and write_params is false") + ": use MasterStorage::fp32");
}

AdamPrologueParams prologue_params(const AdamConfig& c) {
  AdamPrologueParams p;
  p.beta1 = c.beta1;
  p.beta2 = c.beta2;
  p.num_groups = static_cast<int>(c.groups.size());
  p.decoupled = c.decoupled_weight_decay;
  for (std::size_t g = 0; g < c.groups.size(); ++g) {
    p.lr_scale[g] = c.groups[g].lr_scale;
    p.weight_decay[g] = c.groups[g].weight_decay;
  }
  return p;
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

AdamApplyLaunch prepare_apply(const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                              Backend backend, const kernels::AdamAmaxChunk* amax = nullptr) {
  check_config(config);
  SHARDOPT_REQUIRE(scalars != nullptr, ErrorCode::InvalidArgument, "fused Adam: StepScalars pointer is null");
  SHARDOPT_REQUIRE(shard.num_chunks >= 0 && shard.shard_numel >= 0, ErrorCode::InvalidArgument,
                   "ShardPointers: num_chunks and shard_numel must be >= 0");
  AdamApplyLaunch L;
  AdamVariant& v = L.variant;
  v.grad = config.grad_dtype;
  v.moment = config.moment_dtype;
  v.param = config.param_dtype;
  v.write_params = config.write_params;
  v.decoupled = config.decoupled_weight_decay;
  v.remainder = config.master_storage == MasterStorage::bf16_remainder;
  AdamApplyParams& a = L.params;
  a.scalars = scalars;
  a.num_chunks = shard.num_chunks;
  if (shard.num_chunks == 0) return L;
  SHARDOPT_REQUIRE(shard.chunks != nullptr && shard.grads != nullptr && shard.exp_avg != nullptr &&
                       shard.exp_avg_sq != nullptr && (v.remainder ? shard.remainders != nullptr : shard.master != nullptr),
                   ErrorCode::InvalidArgument,
                   std::string("ShardPointers: chunks, grads, exp_avg, exp_avg_sq and ") +
                       (v.remainder ? "remainders (MasterStorage::bf16_remainder)" : "master") + " must all be set");
  const bool q8 = v.moment == DType::q8_block;
  SHARDOPT_REQUIRE(!q8 || (shard.exp_avg_scales != nullptr && shard.exp_avg_sq_scales != nullptr),
                   ErrorCode::InvalidArgument,
                   "ShardPointers: moment_dtype q8_block needs exp_avg_scales and exp_avg_sq_scales (one float per "
                   "block of kMomentBlock moment elements)");
  SHARDOPT_REQUIRE(!q8 || amax == nullptr, ErrorCode::InvalidArgument,
                   "8-bit moments (q8_block) do not emit NVFP4 amaxes: NVFP4 buffers keep f32 or bf16 moments");
  SHARDOPT_REQUIRE(!config.write_params || shard.params != nullptr, ErrorCode::InvalidArgument,
                   "ShardPointers::params is null but AdamConfig::write_params is true; give the param "
                   "buffer or set write_params = false");
  a.chunks = shard.chunks;
  a.grads = shard.grads;
  a.params = config.write_params ? shard.params : nullptr;
  a.master = v.remainder ? nullptr : shard.master;
  a.remainder = v.remainder ? shard.remainders : nullptr;
  a.exp_avg = shard.exp_avg;
  a.exp_avg_sq = shard.exp_avg_sq;
  a.exp_avg_scale = q8 ? shard.exp_avg_scales : nullptr;
  a.exp_avg_sq_scale = q8 ? shard.exp_avg_sq_scales : nullptr;
  a.num_groups = static_cast<int>(config.groups.size());
  a.consts.beta2 = static_cast<float>(config.beta2);
  a.consts.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
  a.consts.beta1_rounded = 1.0f - a.consts.one_minus_beta1;
  a.consts.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
  a.consts.eps = static_cast<float>(config.eps);
  for (std::size_t g = 0; g < config.groups.size(); ++g)
    a.consts.l2[g] = static_cast<float>(config.groups[g].weight_decay);
  a.amax = amax;
  a.vector_ok = aligned16(a.grads) && aligned16(v.remainder ? static_cast<const void*>(a.remainder) : a.master) &&
                aligned16(a.exp_avg) && aligned16(a.exp_avg_sq) &&
                (!config.write_params || aligned16(a.params));
  if (backend == Backend::Host) {
    // The table is host memory here: check it once, before anything is enqueued.
    const std::int64_t moment_numel = shard.moment_numel > 0 ? shard.moment_numel : shard.shard_numel;
    for (std::int64_t c = 0; c < shard.num_chunks; ++c) {
      const ShardChunk& ch = shard.chunks[c];
      SHARDOPT_REQUIRE(ch.group >= 0 && ch.group < a.num_groups && ch.length >= 0 && ch.shard_offset >= 0 &&
                           ch.buffer_offset >= 0 && ch.shard_offset + ch.length <= shard.shard_numel &&
                           ch.moment_shift >= 0 && ch.moment_shift <= ch.shard_offset &&
                           ch.shard_offset - ch.moment_shift + ch.length <= moment_numel,
                       ErrorCode::InvalidArgument,
                       "chunk " + std::to_string(c) + " has group " + std::to_string(ch.group) +
                           " (AdamConfig has " + std::to_string(a.num_groups) +
                           " groups) or lies outside the shard of " + std::to_string(shard.shard_numel) +
                           " elements or its moments outside the " + std::to_string(moment_numel) +
                           " of exp_avg / exp_avg_sq");
      SHARDOPT_REQUIRE(!q8 || (ch.shard_offset - ch.moment_shift) % kMomentBlock == 0, ErrorCode::InvalidArgument,
                       "chunk " + std::to_string(c) + " starts at moment index " +
                           std::to_string(ch.shard_offset - ch.moment_shift) + ", which is not a multiple of " +
                           std::to_string(kMomentBlock) + ": 8-bit moments (q8_block) keep one scale per block of " +
                           std::to_string(kMomentBlock) + " elements of a parameter, so every chunk starts a block");
      if (amax == nullptr || amax[c].amax == nullptr) continue;
      const kernels::AdamAmaxChunk& t = amax[c];
      SHARDOPT_REQUIRE(t.first >= 0 && t.member_numel > 0 && t.cols > 0 && t.member_numel % t.cols == 0 &&
                           t.block_cols == (t.cols + 15) / 16 &&
                           t.amax_numel == (t.member_numel / t.cols + 15) / 16 * t.block_cols + 1,
                       ErrorCode::InvalidArgument,
                       "amax entry of chunk " + std::to_string(c) + " does not describe an NVFP4 member grid");
    }
  }
  return L;
}

void enqueue_prologue(const AdamPrologueParams& p, StepScalars* scalars, Backend backend, Stream stream) {
  if (backend == Backend::Host) {
    host_enqueue(stream, [p, scalars] { kernels::adam_prologue(p, scalars); });
    return;
  }
  kernels::launch_adam_prologue(p, scalars, stream);
}

void enqueue_apply(const AdamApplyLaunch& L, Backend backend, Stream stream) {
  if (L.params.num_chunks == 0) return;
  const bool q8 = L.variant.moment == DType::q8_block;
  if (backend == Backend::Host) {
    host_enqueue(stream, [v = L.variant, a = L.params, q8] {
      if (q8) {
        kernels::host_adam_q8_apply(v, a);
      } else {
        kernels::host_adam_apply(v, a);
      }
    });
    return;
  }
  if (q8) {
    kernels::launch_adam_q8_apply(L.variant, L.params, stream);
  } else {
    kernels::launch_adam_apply(L.variant, L.params, stream);
  }
}

}  // namespace

const char* to_string(MasterStorage m) noexcept {
  return m == MasterStorage::bf16_remainder ? "bf16_remainder" : "fp32";
}

std::vector<ShardChunk> split_shard_chunks(const std::vector<ShardChunk>& pieces, std::int64_t max_chunk) {
  SHARDOPT_REQUIRE(max_chunk > 0, ErrorCode::InvalidArgument,
                   "shard_chunks: max_chunk must be > 0 (got " + std::to_string(max_chunk) + ")");
  std::vector<ShardChunk> out;
  for (const ShardChunk& piece : pieces) {
    for (std::int64_t done = 0; done < piece.length; done += max_chunk) {
      ShardChunk c = piece;
      c.shard_offset = piece.shard_offset + done;
      c.buffer_offset = piece.buffer_offset + done;
      c.length = std::min(max_chunk, piece.length - done);
      out.push_back(c);
    }
  }
  return out;
}

void adam_step_prologue(const AdamConfig& config, StepScalars* scalars, Backend backend, Stream stream) {
  check_config(config);
  SHARDOPT_REQUIRE(scalars != nullptr, ErrorCode::InvalidArgument, "adam_step_prologue: scalars is null");
  enqueue_prologue(prologue_params(config), scalars, backend, stream);
}

void adam_step_apply(const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars, Backend backend,
                     Stream stream) {
  enqueue_apply(prepare_apply(config, shard, scalars, backend), backend, stream);
}

namespace kernels {
AdamApplyLaunch prepare_adam_apply(const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                                   Backend backend) {
  return prepare_apply(config, shard, scalars, backend);
}

void adam_step_apply_emitting(const AdamConfig& config, const ShardPointers& shard, const AdamAmaxChunk* amax,
                              StepScalars* scalars, Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(amax != nullptr && !config.write_params, ErrorCode::InvalidArgument,
                   "adam_step_apply_emitting: give the amax table, and write_params = false (NVFP4 buffers have "
                   "no param buffer)");
  enqueue_apply(prepare_apply(config, shard, scalars, backend, amax), backend, stream);
}
}  // namespace kernels

void fused_adam_step(const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars, Backend backend,
                     Stream stream) {
  // Validate everything before enqueueing anything: a throw leaves the stream untouched.
  const AdamApplyLaunch L = prepare_apply(config, shard, scalars, backend);
  enqueue_prologue(prologue_params(config), scalars, backend, stream);
  enqueue_apply(L, backend, stream);
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::kernels {
void launch_adam_prologue(const AdamPrologueParams&, StepScalars*, Stream) { detail::no_cuda("fused Adam"); }
void launch_adam_apply(const AdamVariant&, const AdamApplyParams&, Stream) { detail::no_cuda("fused Adam"); }
}  // namespace shardopt::kernels
#endif
