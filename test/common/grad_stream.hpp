// grad_stream.hpp - a deterministic stream of gradients for optimizer tests.
//
// The value of every gradient element is a pure function of (step, microbatch, rank,
// param, element), so each rank can compute what any other rank contributes, and a
// captured graph produces the same values as eager execution only if it reads the step
// and microbatch counters from the device at run time (as the writers below do).
//
//  * Grid: integers in [-8, 8] divided by 64. Sums over up to 4 ranks and their squares
//    are exact in f32, bf16 and f16, so any reduction order gives identical bits.
//  * Random: roughly normal with standard deviation `scale` (a sum of four uniforms).
#pragma once

#include <cstdint>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/microbatch.hpp"
#include "shardopt/numerics.hpp"
#include "shardopt_config.h"

namespace shardopt::test {

enum class GradKind : std::int32_t { Grid = 0, Random = 1 };

SHARDOPT_HD std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/// The gradient element of (step, microbatch, rank, param, element).
SHARDOPT_HD float grad_value(GradKind kind, float scale, std::int64_t step, std::int32_t mb, std::int32_t rank,
                             std::int32_t param, std::int64_t j) {
  std::uint64_t h = mix64(static_cast<std::uint64_t>(step) * 0x9E3779B97F4A7C15ull ^
                          (static_cast<std::uint64_t>(mb) << 48) ^ (static_cast<std::uint64_t>(rank) << 40) ^
                          (static_cast<std::uint64_t>(param) << 32) ^ static_cast<std::uint64_t>(j));
  if (kind == GradKind::Grid) return static_cast<float>(static_cast<int>(h % 17u) - 8) / 64.0f;
  float u = 0.0f;
  for (int i = 0; i < 4; ++i) {
    u += static_cast<float>((h >> (16 * i)) & 0xFFFFu) / 65536.0f;
  }
  return (u - 2.0f) * 1.7320508f * scale;  // four uniforms: variance 1/3 -> unit variance
}

/// One gradient tensor to write.
struct GradTarget {
  void* data = nullptr;
  std::int64_t numel = 0;
  std::int32_t param = 0;
  DType dtype = DType::f32;
};

/// What the writers need; the step and microbatch are read from the device when they run.
struct GradStreamParams {
  GradKind kind = GradKind::Grid;
  float scale = 1.0f;
  std::int32_t rank = 0;
  const StepScalars* scalars = nullptr;        ///< step counter (device)
  const MicrobatchState* microbatch = nullptr; ///< microbatch index (device); null -> 0
  /// Poison: when >= 0, element `poison_element` of param `poison_param` becomes +Inf on
  /// step `poison_step` (1-based step about to be applied = scalars->step + 1).
  std::int32_t poison_param = -1;
  std::int64_t poison_element = 0;
  std::int64_t poison_step = -1;
  /// When true, add_grads adds nothing on the ranks other than world rank 0 (the reshard
  /// cases at a group size that is not a power of two: NCCL's average pre-multiplies
  /// every input by 1/size, so an average of equal gradients is not exact there; those
  /// cases reduce with Sum and let rank 0 alone add).
  bool only_world_rank_zero = false;
};

/// grad += value(...) for every target, stream-ordered (host_enqueue on the host
/// backend, a kernel on CUDA; targets must stay alive until it ran).
void add_grads(Backend backend, Stream stream, const GradStreamParams& p, const std::vector<GradTarget>& targets);

/// Keeps `stream` busy for about `microseconds` (a sleeping kernel on CUDA; on the host
/// backend a sleep enqueued on the stream: the host's gathers land only when waited, so
/// its ordering tests fail on a missing wait with or without it). Used to delay a
/// library stream in ordering tests.
void delay_stream(Backend backend, Stream stream, int microseconds);

/// The CUDA writers behind add_grads and delay_stream: grad_stream.cu in a CUDA build,
/// grad_stream_none.cpp (Error(Unsupported), never reached: no Backend::Cuda) without.
void add_grads_cuda(Stream stream, const GradStreamParams& p, const std::vector<GradTarget>& targets);
void delay_stream_cuda(Stream stream, int microseconds);

/// Host element loop (the host backend's writer and the reference's source of values).
SHARDOPT_HD void add_grad_element(const GradStreamParams& p, std::int64_t step, std::int32_t mb,
                                  const GradTarget& t, std::int64_t j) {
  float v = grad_value(p.kind, p.scale, step, mb, p.rank, t.param, j);
  if (p.poison_param == t.param && p.poison_element == j && p.poison_step == step + 1) v = num::f32_from_bits(0x7F800000u);
  switch (t.dtype) {
    case DType::f32: static_cast<float*>(t.data)[j] += v; break;
    case DType::bf16: {
      auto* q = static_cast<std::uint16_t*>(t.data) + j;
      *q = num::f32_to_bf16(num::bf16_to_f32(*q) + v);
      break;
    }
    case DType::f16: {
      auto* q = static_cast<std::uint16_t*>(t.data) + j;
      *q = num::f32_to_f16(num::f16_to_f32(*q) + v);
      break;
    }
    default: break;
  }
}

}  // namespace shardopt::test
