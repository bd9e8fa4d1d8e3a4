// adam_launch.hpp - internal entry points of the fused Adam step: CUDA launch wrappers
// (defined in adam.cu, present only in CUDA builds) and the host twin (adam_host.cpp).
#pragma once

#include "kernels/adam/adam_math.cuh"
#include "shardopt/backend.hpp"
#include "shardopt/fused_adam.hpp"

namespace shardopt::kernels {

/// Validated kernel arguments of one main pass.
struct AdamApplyLaunch {
  AdamVariant variant;
  AdamApplyParams params;
};

/// The checks and kernel arguments of adam_step_apply (config, pointers; with the Host
/// backend also every chunk of the host table `shard.chunks`), without enqueueing.
/// Throws Error(InvalidArgument) as adam_step_apply does.
AdamApplyLaunch prepare_adam_apply(const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                                   Backend backend);

/// CUDA: the one-thread prologue kernel.
void launch_adam_prologue(const AdamPrologueParams& p, StepScalars* scalars, Stream stream);
/// CUDA: the main pass over the shard's chunks (one launch; nothing when no chunks).
void launch_adam_apply(const AdamVariant& v, const AdamApplyParams& a, Stream stream);

/// Host twin of the main pass (runs now; callers wrap it in host_enqueue).
void host_adam_apply(const AdamVariant& v, const AdamApplyParams& a);

/// The main pass over 8-bit moments (AdamVariant::moment q8_block, adam_q8.cuh): CUDA
/// (adam_q8.cu) and its host twin.
void launch_adam_q8_apply(const AdamVariant& v, const AdamApplyParams& a, Stream stream);
void host_adam_q8_apply(const AdamVariant& v, const AdamApplyParams& a);

/// Whole 8-bit moment arrays of n elements (a multiple of kMomentBlock) to fp32 values
/// and back (encode: each block's scale is its max, moment_code.cuh); `second`: the
/// second moment's map (bytes code sqrt(v)). CUDA; q8_decode / q8_encode dispatch.
void launch_q8_decode(const std::uint8_t* codes, const float* scales, float* out, std::int64_t n, bool second,
                      Stream stream);
void launch_q8_encode(const float* in, std::uint8_t* codes, float* scales, std::int64_t n, bool second, Stream stream);
/// The conversions on either backend (host: enqueued on the host stream).
void q8_decode(const std::uint8_t* codes, const float* scales, float* out, std::int64_t n, bool second,
               Backend backend, Stream stream);
void q8_encode(const float* in, std::uint8_t* codes, float* scales, std::int64_t n, bool second, Backend backend,
               Stream stream);

}  // namespace shardopt::kernels
