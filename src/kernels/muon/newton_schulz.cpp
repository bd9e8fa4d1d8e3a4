// newton_schulz.cpp - Muon's per-matrix math on the host: the learning-rate ratio, the
// Newton-Schulz iteration (plain fp32 GEMM loops, fp32 accumulation in index order) and
// one matrix's momentum + orthogonalization (torch.optim.Muon's order of operations).
#include <algorithm>
#include <cmath>

#include "kernels/muon/muon.hpp"
#include "kernels/muon/muon_math.cuh"

namespace shardopt {

double muon_lr_ratio(MuonLrAdjust adjust, std::int64_t rows, std::int64_t cols) noexcept {
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  return adjust == MuonLrAdjust::MatchRmsAdamW ? 0.2 * std::sqrt(std::max(r, c)) : std::sqrt(std::max(1.0, r / c));
}

const char* to_string(GroupAlgorithm a) noexcept { return a == GroupAlgorithm::Muon ? "muon" : "adamw"; }
const char* to_string(MuonLrAdjust a) noexcept {
  return a == MuonLrAdjust::MatchRmsAdamW ? "match_rms_adamw" : "original";
}
const char* to_string(MuonGemm g) noexcept { return g == MuonGemm::F32 ? "f32" : "bf16"; }

namespace kernels {

std::int64_t newton_schulz_workspace(std::int64_t rows, std::int64_t cols) noexcept {
  const std::int64_t n = std::min(rows, cols), k = std::max(rows, cols);
  return 2 * n * k + 2 * n * n;
}

std::int64_t muon_workspace(std::int64_t rows, std::int64_t cols) noexcept {
  return newton_schulz_workspace(rows, cols) + rows * cols;
}

void newton_schulz_host(float* x, std::int64_t n, std::int64_t k, int steps, const std::array<double, 3>& coefficients,
                        float* work) {
  const float a = static_cast<float>(coefficients[0]), b = static_cast<float>(coefficients[1]),
              c = static_cast<float>(coefficients[2]);
  float* y = work;            // n x k: the next X
  float* acc = y + n * k;     // k: one row of B X
  float* gram = acc + n * k;  // n x n: A = X X^T
  float* upd = gram + n * n;  // n x n: B = b A + c A A
  for (int s = 0; s < steps; ++s) {
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (std::int64_t l = 0; l < k; ++l) sum += x[i * k + l] * x[j * k + l];
        gram[i * n + j] = sum;
      }
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;  // (A A)[i][j]; A is symmetric, so column j is row j
        for (std::int64_t l = 0; l < n; ++l) sum += gram[i * n + l] * gram[j * n + l];
        upd[i * n + j] = b * gram[i * n + j] + c * sum;
      }
    for (std::int64_t i = 0; i < n; ++i) {
      std::fill(acc, acc + k, 0.0f);
      for (std::int64_t j = 0; j < n; ++j) {
        const float bij = upd[i * n + j];
        for (std::int64_t l = 0; l < k; ++l) acc[l] += bij * x[j * k + l];
      }
      for (std::int64_t l = 0; l < k; ++l) y[i * k + l] = a * x[i * k + l] + acc[l];
    }
    std::copy(y, y + n * k, x);
  }
}

void muon_matrix_host(const MuonMatrix& mat, float* work) {
  const MuonSettings& s = mat.settings;
  const std::int64_t rows = mat.rows, cols = mat.cols, count = rows * cols;
  const float w_buf = static_cast<float>(1.0 - s.momentum), w_nes = static_cast<float>(s.momentum);
  double sumsq = 0.0;
  for (std::int64_t i = 0; i < count; ++i) {
    mat.g[i] = muon_momentum(mat.m[i], mat.g[i], w_buf, w_nes, s.nesterov);
    sumsq += static_cast<double>(mat.g[i]) * mat.g[i];
  }
  const float norm = std::max(static_cast<float>(std::sqrt(sumsq)), static_cast<float>(s.eps));
  // X: rows <= cols as it is; otherwise its transpose (cols x rows), held in the scratch tail.
  const bool transposed = rows > cols;
  const std::int64_t n = std::min(rows, cols), k = std::max(rows, cols);
  float* x = transposed ? work + newton_schulz_workspace(rows, cols) : mat.g;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const float v = mat.g[i * cols + j] / norm;
      if (transposed) x[j * rows + i] = v; else x[i * cols + j] = v;
    }
  newton_schulz_host(x, n, k, s.ns_steps, s.ns_coefficients, work);
  if (transposed)
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) mat.g[i * cols + j] = x[j * rows + i];
}

}  // namespace kernels
}  // namespace shardopt
