// known_grads.hpp - gradients whose exact mean is known, and the oracles of
// GradReducePrecision::F32Accumulate (shared by test/mpi/grad_reduce_cases.hpp and
// test/common/grad_reduce_opt_cases.hpp).
//
// known_grad values are bf16 numbers (1 + m/128) * 2^e with e in [-4, 3]: any sum of up
// to 8 of them is a multiple of 2^-11 below 2^7, exact in fp32 in any order, so the fp32
// rank-order sum is the exact sum and an F32Accumulate mean is the exact mean rounded
// once (exact for power-of-two rank counts).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/grad_stream.hpp"

namespace shardopt::test {

/// The known gradient of rank r at element j of stream `k` (a buffer, a parameter): an
/// exact bf16 value (1 + m/128) * 2^e, e in [-4, 3], either sign.
inline float known_grad(int r, std::int64_t k, std::int64_t j) {
  const std::uint64_t h = mix64((static_cast<std::uint64_t>(r) << 48) ^ (static_cast<std::uint64_t>(k) << 40) ^
                                    static_cast<std::uint64_t>(j) ^ 0x5DEECE66Dull);
  const float m = static_cast<float>(h % 128);
  const int e = static_cast<int>((h >> 8) % 8) - 4;
  const float v = std::ldexp(1.0f + m / 128.0f, e);
  return (h >> 16) & 1 ? -v : v;
}

/// The promised bits: (((0 + x_0) + x_1) + ... + x_{n-1}) in fp32, then / n for average.
inline float rank_order_sum(const std::vector<float>& x, bool average) {
  float acc = 0.0f;
  for (float v : x) acc += v;
  return average ? acc / static_cast<float>(x.size()) : acc;
}

/// |got - exact| <= u * |exact| for one rounding to unit roundoff u. The exact mean is
/// computed in double from exact inputs; the slack 2^-15 covers the fp32 quotient that a
/// bf16 result is rounded from (2^-24 against 2^-8).
inline bool within_one_rounding(double got, double exact, double u) {
  return std::fabs(got - exact) <= u * std::fabs(exact) * (1.0 + std::ldexp(1.0, -15));
}

}  // namespace shardopt::test
