// piece_sum_math.cuh - one element of the rank-ordered fp32 sum of n pieces (host and
// device), the reduction step of GradReducePrecision::F32Accumulate.
#pragma once

#include <cstdint>

#include "kernels/common/convert_math.cuh"

namespace shardopt::kernels {

/// The end of the sum: divided once by n when `average` (IEEE division, no contraction).
SHARDOPT_HD float piece_sum_finish(float acc, int n, bool average) {
  return average ? acc / static_cast<float>(n) : acc;
}

/// Piece r's element i: at pieces + r * count, except piece `own_index`, which is read
/// at `own` (null: every piece in `pieces`).
SHARDOPT_HD float piece_value(const void* pieces, const void* own, int own_index, DType t, int r, std::int64_t count,
                              std::int64_t i) {
  return r == own_index && own != nullptr ? load_as_f32(own, t, i)
                                          : load_as_f32(pieces, t, static_cast<std::int64_t>(r) * count + i);
}

/// (((0 + p_0[i]) + p_1[i]) + ... + p_{n-1}[i]) in fp32 (piece_value), then
/// piece_sum_finish. Only adds and one division: the same bits on the host and on the
/// device (subnormals kept on both), wherever the pieces lie.
SHARDOPT_HD float piece_sum_at(const void* pieces, const void* own, int own_index, DType t, int n, std::int64_t count,
                               bool average, std::int64_t i) {
  float acc = 0.0f;
  for (int r = 0; r < n; ++r) acc += piece_value(pieces, own, own_index, t, r, count, i);
  return piece_sum_finish(acc, n, average);
}

/// out[i] <- round_to(out dtype, s) or, when `accumulate`, round_to(out dtype, out[i] + s)
/// (the add in fp32).
SHARDOPT_HD void piece_sum_write(void* out, DType out_dtype, bool accumulate, std::int64_t i, float s) {
  store_from_f32(out, out_dtype, i, accumulate ? load_as_f32(out, out_dtype, i) + s : s);
}

/// One element, start to end: piece_sum_at, then piece_sum_write (every piece's element i
/// is read before out[i] is written, so `own` may be `out`).
SHARDOPT_HD void piece_sum_store(const void* pieces, const void* own, int own_index, DType t, int n,
                                 std::int64_t count, bool average, void* out, DType out_dtype, bool accumulate,
                                 std::int64_t i) {
  piece_sum_write(out, out_dtype, accumulate, i, piece_sum_at(pieces, own, own_index, t, n, count, average, i));
}

}  // namespace shardopt::kernels
