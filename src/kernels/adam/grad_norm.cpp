// grad_norm.cpp - public gradient-norm entry points: validation and dispatch to the
// CUDA kernels or the host twin.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.hpp"
#include "kernels/adam/grad_norm_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

namespace shardopt {
namespace {

}  // namespace

void accumulate_grad_sumsq(DType grad_dtype, const ShardPointers& shard, StepScalars* scalars, Backend backend,
                           Stream stream) {
  SHARDOPT_REQUIRE(is_float_storage(grad_dtype), ErrorCode::InvalidArgument,
                   std::string("accumulate_grad_sumsq: grad dtype ") + to_string(grad_dtype) +
                       " is not one of f32, bf16, f16");
  SHARDOPT_REQUIRE(scalars != nullptr, ErrorCode::InvalidArgument, "accumulate_grad_sumsq: scalars is null");
  SHARDOPT_REQUIRE(shard.num_chunks >= 0, ErrorCode::InvalidArgument,
                   "accumulate_grad_sumsq: ShardPointers::num_chunks must be >= 0");
  SHARDOPT_REQUIRE(shard.num_chunks == 0 || (shard.chunks != nullptr && shard.grads != nullptr),
                   ErrorCode::InvalidArgument, "accumulate_grad_sumsq: ShardPointers chunks and grads must be set");
  kernels::GradNormParams a;
  a.chunks = shard.chunks;
  a.num_chunks = shard.num_chunks;
  a.grads = shard.grads;
  a.vector_ok = (reinterpret_cast<std::uintptr_t>(shard.grads) & 15u) == 0;
  // Address arithmetic only: device memory is never read on the host.
  a.partials = reinterpret_cast<float*>(reinterpret_cast<char*>(scalars) + offsetof(StepScalars, norm_partials));
  a.scalars = scalars;
  if (backend == Backend::Host) {
    host_enqueue(stream, [grad_dtype, a] { kernels::host_grad_sumsq(grad_dtype, a); });
    return;
  }
  kernels::launch_grad_sumsq(grad_dtype, a, stream);
}

void finalize_grad_norm(float max_norm, StepScalars* scalars, Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(scalars != nullptr, ErrorCode::InvalidArgument, "finalize_grad_norm: scalars is null");
  SHARDOPT_REQUIRE(max_norm >= 0.0f, ErrorCode::InvalidArgument,
                   "finalize_grad_norm: max_norm must be >= 0 (0 disables clipping)");
  if (backend == Backend::Host) {
    host_enqueue(stream, [max_norm, scalars] { kernels::finalize_norm(max_norm, scalars); });
    return;
  }
  kernels::launch_finalize_grad_norm(max_norm, scalars, stream);
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::kernels {
void launch_grad_sumsq(DType, const GradNormParams&, Stream) { detail::no_cuda("the gradient-norm kernels"); }
void launch_finalize_grad_norm(float, StepScalars*, Stream) { detail::no_cuda("the gradient-norm kernels"); }
}  // namespace shardopt::kernels
#endif
