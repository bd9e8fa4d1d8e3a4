// piece_sum_math.cuh - one element of the rank-ordered fp32 sum of n pieces (host and
// device), the reduction step of GradReducePrecision::F32Accumulate.
#pragma once

#include <cstdint>

#include "kernels/convert_math.cuh"

namespace shardopt::kernels {

/// (((0 + p_0[i]) + p_1[i]) + ... + p_{n-1}[i]) in fp32, piece r at pieces + r * count
/// (dtype t), then divided once by n when `average`. No multiply, so no contraction: the
/// same bits on the host and on the device (IEEE division, subnormals kept).
SHARDOPT_HD float piece_sum_at(const void* pieces, DType t, int n, std::int64_t count, bool average, std::int64_t i) {
  float acc = 0.0f;
  for (int r = 0; r < n; ++r) acc += load_as_f32(pieces, t, static_cast<std::int64_t>(r) * count + i);
  return average ? acc / static_cast<float>(n) : acc;
}

/// out[i] <- round_to(out dtype, s) or, when `accumulate`, round_to(out dtype, out[i] + s),
/// with s = piece_sum_at(...) (the add in fp32).
SHARDOPT_HD void piece_sum_store(const void* pieces, DType t, int n, std::int64_t count, bool average, void* out,
                                 DType out_dtype, bool accumulate, std::int64_t i) {
  const float s = piece_sum_at(pieces, t, n, count, average, i);
  store_from_f32(out, out_dtype, i, accumulate ? load_as_f32(out, out_dtype, i) + s : s);
}

}  // namespace shardopt::kernels
