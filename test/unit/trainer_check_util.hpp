// trainer_check_util.hpp - what the example trainer's gradient checks share (the MoE
// model in test_trainer_ops.cpp, the GPT in test_trainer_gpt.cpp): random vectors,
// central differences, and the two whole-model checks: every sampled gradient element
// against a central difference of the double-precision model's loss, and the
// mixed-precision host model's loss and gradients against the double model's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model.hpp"
#include "model_spec.hpp"
#include "ops.hpp"
#include "weights.hpp"

namespace trainer::check {

/// n values uniform in [-scale, scale), from `seed`.
inline std::vector<double> random_vector(std::size_t n, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

/// Central difference of f at x[i] (x[i] is restored).
inline double central(std::vector<double>& x, std::size_t i, const std::function<double()>& f, double eps = 1e-6) {
  const double keep = x[i];
  x[i] = keep + eps;
  const double up = f();
  x[i] = keep - eps;
  const double down = f();
  x[i] = keep;
  return (up - down) / (2.0 * eps);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// An op's analytic gradient element against its central difference.
inline void expect_grad(double analytic, double numeric, const std::string& what) {
  EXPECT_NEAR(analytic, numeric, 1e-7 * std::max(1.0, std::fabs(numeric))) << what;
}

/// Tensor t of a double-precision host model (host memory: a view).
inline double* dptr(const Tensor& t) { return t.as<double>(); }

/// Runs one microbatch of the double-precision model `spec` on `w` (weights of `ops`)
/// and checks up to `per_param` elements of every parameter's gradient, spread over it,
/// against a central difference of the loss; at least `min_checked` elements in all, a
/// first loss above 0.5, and the loss of the unperturbed weights unchanged at the end.
inline void expect_model_gradients_match_finite_differences(const ModelSpec& spec, Ops& ops, ArrayWeights& w,
                                                             const std::vector<std::int32_t>& tokens,
                                                             const std::vector<std::int32_t>& targets, int per_param,
                                                             int min_checked) {
  ModelOptions mo;
  mo.generate_batch = false;
  Model model(spec, ops, mo);
  model.set_batch(tokens, targets);
  model.microbatch(w, ops.stream());
  const double loss0 = dptr(model.loss_slots())[0];
  EXPECT_GT(loss0, 0.5);
  auto loss = [&] {
    model.forward(w, ops.stream());
    return dptr(model.loss_slots())[0];
  };
  int checked = 0;
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor p = w.param(i), g = w.grad(i);
    std::vector<double> vals(dptr(p), dptr(p) + p.numel);
    const std::int64_t step = std::max<std::int64_t>(1, p.numel / per_param);
    for (std::int64_t j = 0; j < p.numel; j += step) {
      auto f = [&] {
        std::copy(vals.begin(), vals.end(), dptr(p));
        return loss();
      };
      const double numeric = central(vals, static_cast<std::size_t>(j), f, 1e-6);
      std::copy(vals.begin(), vals.end(), dptr(p));
      EXPECT_NEAR(dptr(g)[j], numeric, 2e-7 * std::max(1e-2, std::fabs(numeric)))
          << spec.params()[static_cast<std::size_t>(i)].name << " element " << j;
      ++checked;
    }
  }
  EXPECT_GT(checked, min_checked);
  EXPECT_NEAR(loss(), loss0, 1e-14);  // the last forward (unperturbed) equals the first
}

/// One microbatch of the double model (`dops`, weights `wd`) and of the mixed one
/// (`mops`, `wm`) holding the same values: the losses within 2% and every parameter's
/// gradient within 5% (relative L2).
inline void expect_mixed_tracks_double(const ModelSpec& spec, Ops& dops, ArrayWeights& wd, Ops& mops, ArrayWeights& wm,
                                       const std::vector<std::int32_t>& tokens,
                                       const std::vector<std::int32_t>& targets) {
  ModelOptions mo;
  mo.generate_batch = false;
  Model md(spec, dops, mo), mm(spec, mops, mo);
  md.set_batch(tokens, targets);
  mm.set_batch(tokens, targets);
  md.microbatch(wd, dops.stream());
  mm.microbatch(wm, mops.stream());
  const double ld = dptr(md.loss_slots())[0], lm = mm.loss_slots().as<float>()[0];
  EXPECT_NEAR(lm, ld, 2e-2 * ld);
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor gd = wd.grad(i), gm = wm.grad(i);
    double num = 0, den = 0;
    for (std::int64_t j = 0; j < gd.numel; ++j) {
      const double diff = dptr(gd)[j] - gm.as<float>()[j];
      num += diff * diff;
      den += dptr(gd)[j] * dptr(gd)[j];
    }
    EXPECT_LT(std::sqrt(num), 0.05 * std::sqrt(den) + 1e-6) << spec.params()[static_cast<std::size_t>(i)].name;
  }
}

}  // namespace trainer::check
