// op_math.hpp - element math shared by the CUDA kernels and the host ops (SHARDOPT_HD):
// the token stream of the task, the text windows, the activations, and the storage conversions.
#pragma once

#include <cmath>
#include <cstdint>

#include <shardopt/numerics.hpp>

namespace trainer::math {

/// A 64-bit mixing function (splitmix64's finaliser): a pure function of its input.
SHARDOPT_HD std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Token at position t of microbatch `mb` of step `step` on rank `rank`: uniform over the
/// vocabulary, different for every (seed, rank, step, microbatch, position).
SHARDOPT_HD std::int32_t token_at(std::uint64_t seed, std::int32_t rank, std::int64_t step, std::int32_t mb,
                                  std::int64_t t, std::int64_t vocab) {
  std::uint64_t h = mix(seed ^ 0x5EEDull);
  h = mix(h ^ static_cast<std::uint64_t>(rank));
  h = mix(h ^ static_cast<std::uint64_t>(step));
  h = mix(h ^ static_cast<std::uint64_t>(mb));
  h = mix(h ^ static_cast<std::uint64_t>(t));
  return static_cast<std::int32_t>(h % static_cast<std::uint64_t>(vocab));
}

/// The rule to learn: the next token is (a * token + c) mod vocab, a bijection when a and
/// vocab are coprime. The cross-entropy floor is 0.
SHARDOPT_HD std::int32_t target_of(std::int32_t token, std::int64_t a, std::int64_t c, std::int64_t vocab) {
  return static_cast<std::int32_t>((a * token + c) % vocab);
}

/// A uniform value in [-bound, bound) from (key, j): the initial parameter values. fp32
/// arithmetic without contractions, so host and device give the same bits.
SHARDOPT_HD float init_uniform(std::uint64_t key, std::int64_t j, float bound) {
  const std::uint64_t h = mix(key ^ mix(static_cast<std::uint64_t>(j)));
  const float u = static_cast<float>(h >> 40) * 0x1.0p-24f;  // [0, 1), exact
  const float centred = 2.0f * u - 1.0f;
  return centred * bound;
}

/// SiLU and its derivative in fp32 (kernels and the mixed-precision host ops).
SHARDOPT_HD float silu(float u) { return u / (1.0f + expf(-u)); }
SHARDOPT_HD float silu_grad(float u) {
  const float s = 1.0f / (1.0f + expf(-u));
  return s * (1.0f + u * (1.0f - s));
}

/// GELU (the erf form, as torch.nn.GELU()) and its derivative in fp32. The normal CDF is
/// written with erfc, 0.5 * erfc(-x / sqrt(2)): 1 + erf(x / sqrt(2)) cancels for negative
/// x, where the device's and the host's erff, an ulp apart near -1, then differ in the
/// tail by far more than a bf16 ulp of the result.
SHARDOPT_HD float gelu(float x) { return 0.5f * x * erfcf(-x * 0.70710678118654752f); }
SHARDOPT_HD float gelu_grad(float x) {
  const float cdf = 0.5f * erfcf(-x * 0.70710678118654752f);
  return cdf + x * 0.39894228040143268f * expf(-0.5f * x * x);
}

/// Where sequence `seq` of microbatch `mb` of step `step` on rank `rank` starts in a token
/// file: uniform over the `starts` windows that have a next token for every position
/// (starts = file tokens - context). A pure function, so a resumed run reads the same data.
SHARDOPT_HD std::int64_t window_start(std::uint64_t seed, std::int32_t rank, std::int64_t step, std::int32_t mb,
                                      std::int64_t seq, std::int64_t starts) {
  std::uint64_t h = mix(seed ^ 0x7E47ull);
  h = mix(h ^ static_cast<std::uint64_t>(rank));
  h = mix(h ^ static_cast<std::uint64_t>(step));
  h = mix(h ^ static_cast<std::uint64_t>(mb));
  h = mix(h ^ static_cast<std::uint64_t>(seq));
  return static_cast<std::int64_t>(h % static_cast<std::uint64_t>(starts));
}

/// bf16 storage (round to nearest even), exactly as shardopt rounds.
SHARDOPT_HD std::uint16_t to_bf16(float f) { return shardopt::num::f32_to_bf16(f); }
SHARDOPT_HD float from_bf16(std::uint16_t b) { return shardopt::num::bf16_to_f32(b); }

/// The bf16 compute value of one MXFP8 element: bf16(fl32(e4m3(data) * 2^(scale - 127))),
/// i.e. shardopt::dequantize_mxfp8's f32 value (the same expression) rounded to bf16. The
/// f32 product is exact (at most 4 significant bits, at least 2^-136) unless it overflows
/// to Inf, and bf16 keeps it exactly unless it is a bf16 subnormal (below 2^-126). NaN
/// elements (0x7F, 0xFF) and NaN scales (0xFF) give the one canonical NaN 0x7FC0: a GPU
/// multiply returns its own NaN payload, and the two backends must agree bitwise.
SHARDOPT_HD std::uint16_t mxfp8_to_bf16(std::uint8_t data, std::uint8_t scale) {
  if ((data & 0x7Fu) == 0x7Fu || scale == 0xFFu) return 0x7FC0u;
  return to_bf16(shardopt::num::e4m3_to_f32(data) * shardopt::num::e8m0_to_f32(scale));
}

/// The RMSNorm epsilon of the model.
inline constexpr float kNormEps = 1e-5f;

}  // namespace trainer::math
