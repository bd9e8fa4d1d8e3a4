// The CUDA path's Newton-Schulz bounds (docs/muon.md "The CUDA path's bounds",
// test/common/muon_oracle.hpp) checked on the host, where no GPU is needed: the bf16 bound
// against an emulation of the bf16 GEMMs (bf16 inputs and outputs, fp32 accumulation and
// epilogue), the fp32 one against the fp32 host twin; each against a double Newton-Schulz.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/muon_oracle.hpp"
#include "kernels/muon/muon.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test::muon;

// A normalized rows x cols input of pseudo-random values (fp32, as the GPU path's
// normalization gives).
std::vector<double> input(int idx, std::int64_t rows, std::int64_t cols) {
  std::vector<double> x(static_cast<std::size_t>(rows * cols));
  for (std::size_t j = 0; j < x.size(); ++j) x[j] = noise(idx, static_cast<std::int64_t>(j));
  const double n = frob(x);
  for (double& v : x) v = static_cast<float>(v / n);
  return x;
}

double frob_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t j = 0; j < a.size(); ++j) s += (a[j] - b[j]) * (a[j] - b[j]);
  return std::sqrt(s);
}

// Both orientations, square, tiny: the bf16 emulation within the bf16 bound, the fp32 twin
// within the fp32 bound; the bf16 bound at most a quarter of ||U||_F and above the change
// of one iteration fewer (it tells a wrong iteration count apart); the fp32 bound at least
// 100 times tighter.
TEST(MuonBounds, TheCudaBoundsHoldForTheirArithmetic) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{24, 16}, {16, 40}, {8, 48}, {96, 64}, {48, 48}};
  MuonSettings s;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto [rows, cols] = shapes[i];
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const std::int64_t n = std::min(rows, cols), k = std::max(rows, cols);
    const std::vector<double> x = input(static_cast<int>(i), rows, cols);
    const std::vector<double> want = ns_double(x, rows, cols, s);
    const std::vector<double> bf16 = from_x(ns_bf16_emulated(to_x(x, rows, cols), n, k, s), rows, cols);
    std::vector<float> xf;
    for (double v : to_x(x, rows, cols)) xf.push_back(static_cast<float>(v));
    std::vector<float> work(static_cast<std::size_t>(kernels::newton_schulz_workspace(n, k)));
    kernels::newton_schulz_host(xf.data(), n, k, s.ns_steps, s.ns_coefficients, work.data());
    const std::vector<double> f32 = from_x(std::vector<double>(xf.begin(), xf.end()), rows, cols);
    const double bound_bf16 = update_error_bound_gemm(x, rows, cols, s, 1, true);
    const double bound_f32 = update_error_bound_gemm(x, rows, cols, s, 1, false);
    const double err_bf16 = frob_diff(bf16, want), err_f32 = frob_diff(f32, want);
    EXPECT_LE(err_bf16, bound_bf16);
    EXPECT_LE(err_f32, bound_f32);
    EXPECT_LE(bound_bf16, 0.25 * frob(want));
    EXPECT_LT(100.0 * bound_f32, bound_bf16);
    MuonSettings fewer = s;
    fewer.ns_steps = s.ns_steps - 1;
    EXPECT_GT(frob_diff(ns_double(x, rows, cols, fewer), want), bound_bf16);
    std::printf("%lld x %lld: bf16 %.3g of bound %.3g, fp32 %.3g of bound %.3g, ||U|| %.3g\n",
                static_cast<long long>(rows), static_cast<long long>(cols), err_bf16, bound_bf16, err_f32, bound_f32,
                frob(want));
  }
}

}  // namespace
