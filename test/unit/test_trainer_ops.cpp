// Gradient checks of the example trainer's model (examples/trainer), on the host in
// double precision: every op's backward against central finite differences of its
// forward, then the whole model (both expert registrations), then the mixed-precision
// host model (what the host backend trains) against the double model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "host_ops.hpp"
#include "model.hpp"
#include "model_spec.hpp"
#include "weights.hpp"

namespace trainer {
namespace {

std::vector<double> random_vector(std::size_t n, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

/// Central difference of f at x[i].
double central(std::vector<double>& x, std::size_t i, const std::function<double()>& f, double eps = 1e-6) {
  const double keep = x[i];
  x[i] = keep + eps;
  const double up = f();
  x[i] = keep - eps;
  const double down = f();
  x[i] = keep;
  return (up - down) / (2.0 * eps);
}

void expect_grad(double analytic, double numeric, const std::string& what) {
  EXPECT_NEAR(analytic, numeric, 1e-7 * std::max(1.0, std::fabs(numeric))) << what;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(TrainerOps, RmsNormBackwardMatchesFiniteDifferences) {
  const std::int64_t T = 3, H = 7;
  auto x = random_vector(T * H, 1), w = random_vector(H, 2), r = random_vector(T * H, 3);
  auto loss = [&] {
    std::vector<double> y(T * H), rstd(T);
    host::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), T, H, 1e-5f);
    return dot(y, r);
  };
  std::vector<double> y(T * H), rstd(T), dx(T * H, 0.5), dw(H, 0.25);
  host::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), T, H, 1e-5f);
  host::rmsnorm_backward(r.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), T, H);
  for (std::size_t i = 0; i < x.size(); ++i) expect_grad(dx[i] - 0.5, central(x, i, loss), "dx " + std::to_string(i));
  for (std::size_t i = 0; i < w.size(); ++i) expect_grad(dw[i] - 0.25, central(w, i, loss), "dw " + std::to_string(i));
}

TEST(TrainerOps, SiluBackwardMatchesFiniteDifferences) {
  auto u = random_vector(9, 4, 4.0), r = random_vector(9, 5);
  auto loss = [&] {
    std::vector<double> a(9);
    host::silu_forward(u.data(), a.data(), 9);
    return dot(a, r);
  };
  std::vector<double> du(9);
  host::silu_backward(r.data(), u.data(), du.data(), 9);
  for (std::size_t i = 0; i < u.size(); ++i) expect_grad(du[i], central(u, i, loss), "du " + std::to_string(i));
}

TEST(TrainerOps, RouterBackwardMatchesFiniteDifferences) {
  const std::int64_t T = 5;
  const int G = 4;
  auto logits = random_vector(T * G, 6, 2.0), r = random_vector(T, 7);
  auto loss = [&] {
    std::vector<double> probs(T * G), gate(T);
    std::vector<std::int32_t> expert(T);
    host::router_forward(logits.data(), probs.data(), expert.data(), gate.data(), T, G);
    return dot(gate, r);
  };
  std::vector<double> probs(T * G), gate(T), dl(T * G);
  std::vector<std::int32_t> expert(T);
  host::router_forward(logits.data(), probs.data(), expert.data(), gate.data(), T, G);
  host::router_backward(r.data(), probs.data(), expert.data(), dl.data(), T, G);
  for (std::size_t i = 0; i < logits.size(); ++i) expect_grad(dl[i], central(logits, i, loss), "dlogit " + std::to_string(i));
}

TEST(TrainerOps, DispatchKeepsTokenOrderAndCapacity) {
  const std::int64_t T = 7, H = 2, C = 2;
  const int G = 3;
  const std::vector<std::int32_t> expert = {1, 0, 1, 1, 2, 0, 1};
  std::vector<double> x(T * H);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i + 1);
  std::vector<std::int32_t> slot(T), row_token(G * C);
  std::vector<double> xe(G * C * H, -1.0);
  host::dispatch(expert.data(), x.data(), slot.data(), row_token.data(), xe.data(), T, H, G, C);
  EXPECT_EQ(slot, (std::vector<std::int32_t>{0, 0, 1, -1, 0, 1, -1})) << "slots in token order, -1 past capacity";
  EXPECT_EQ(row_token, (std::vector<std::int32_t>{1, 5, 0, 2, 4, -1})) << "padding rows are -1";
  EXPECT_EQ(xe[0], x[2]);                 // expert 0 slot 0 = token 1
  EXPECT_EQ(xe[(2 * C + 1) * H], 0.0);    // expert 2 slot 1: padding, zeros
  EXPECT_EQ(xe[(2 * C + 1) * H + 1], 0.0);
}

TEST(TrainerOps, CombineAndDispatchBackwardMatchFiniteDifferences) {
  const std::int64_t T = 6, H = 3, C = 2;
  const int G = 2;
  const std::vector<std::int32_t> expert = {0, 1, 0, 0, 1, 1};
  auto ye = random_vector(G * C * H, 8), gate = random_vector(T, 9), R = random_vector(T * H, 10);
  auto x = random_vector(T * H, 11), Re = random_vector(G * C * H, 12);
  std::vector<std::int32_t> slot(T), row_token(G * C);
  std::vector<double> xe(G * C * H);
  host::dispatch(expert.data(), x.data(), slot.data(), row_token.data(), xe.data(), T, H, G, C);
  auto combine_loss = [&] {
    std::vector<double> h(T * H, 0.0);
    host::combine_forward(ye.data(), expert.data(), slot.data(), gate.data(), h.data(), T, H, C);
    return dot(h, R);
  };
  std::vector<double> dye(G * C * H), dgate(T);
  host::combine_backward(R.data(), ye.data(), expert.data(), slot.data(), gate.data(), row_token.data(), dye.data(),
                         dgate.data(), T, H, G, C);
  for (std::size_t i = 0; i < ye.size(); ++i) expect_grad(dye[i], central(ye, i, combine_loss), "dye " + std::to_string(i));
  for (std::size_t i = 0; i < gate.size(); ++i)
    expect_grad(dgate[i], central(gate, i, combine_loss), "dgate " + std::to_string(i));
  auto dispatch_loss = [&] {
    std::vector<std::int32_t> s(T), rt(G * C);
    std::vector<double> out(G * C * H);
    host::dispatch(expert.data(), x.data(), s.data(), rt.data(), out.data(), T, H, G, C);
    return dot(out, Re);
  };
  std::vector<double> dx(T * H);
  host::dispatch_backward(Re.data(), expert.data(), slot.data(), dx.data(), T, H, C);
  for (std::size_t i = 0; i < x.size(); ++i) expect_grad(dx[i], central(x, i, dispatch_loss), "dx " + std::to_string(i));
  EXPECT_EQ(slot[5], -1) << "the case must drop a token";
}

TEST(TrainerOps, CrossEntropyBackwardMatchesFiniteDifferences) {
  const std::int64_t T = 4, V = 6;
  auto logits = random_vector(T * V, 13, 3.0);
  const std::vector<std::int32_t> targets = {2, 0, 5, 2};
  auto loss = [&] {
    std::vector<double> dl(T * V), tl(T);
    double slot = 0;
    host::cross_entropy(logits.data(), targets.data(), dl.data(), tl.data(), &slot, 1.0 / T, T, V);
    return slot;
  };
  std::vector<double> dl(T * V), tl(T);
  double slot = 0;
  host::cross_entropy(logits.data(), targets.data(), dl.data(), tl.data(), &slot, 1.0 / T, T, V);
  for (std::size_t i = 0; i < logits.size(); ++i) expect_grad(dl[i], central(logits, i, loss), "dlogit " + std::to_string(i));
  EXPECT_NEAR(slot, (tl[0] + tl[1] + tl[2] + tl[3]) / 4, 1e-15);
}

TEST(TrainerOps, EmbeddingBackwardSumsRepeatedTokens) {
  const std::int64_t T = 6, H = 2, V = 4;
  const std::vector<std::int32_t> tokens = {3, 1, 3, 0, 3, 1};
  auto table = random_vector(V * H, 14), R = random_vector(T * H, 15);
  auto loss = [&] {
    std::vector<double> out(T * H);
    host::embed_forward(table.data(), tokens.data(), out.data(), T, H);
    return dot(out, R);
  };
  std::vector<double> dtable(V * H, 1.0);
  std::vector<std::int32_t> links(T);
  host::embed_backward(R.data(), tokens.data(), links.data(), dtable.data(), T, H);
  for (std::size_t i = 0; i < table.size(); ++i)
    expect_grad(dtable[i] - 1.0, central(table, i, loss), "dtable " + std::to_string(i));
}

// ---------------------------------------------------------------- whole model

ModelConfig check_config() {
  // Capacity ceil(0.8 * 10 / 3) = 3: some tokens are dropped; vocab 13 with 10 tokens
  // repeats some (embedding accumulation).
  return ModelConfig{13, 8, 2, 12, 3, 6, 0.8, 10};
}

std::vector<std::int32_t> check_tokens() { return {4, 11, 4, 0, 7, 12, 4, 3, 11, 9}; }
std::vector<std::int32_t> check_targets() { return {1, 5, 1, 12, 3, 0, 2, 8, 5, 6}; }

/// Reads tensor t of a double-precision host model as a vector (host memory: a view).
double* dptr(const Tensor& t) { return t.as<double>(); }

class WholeModel : public ::testing::TestWithParam<bool> {};

TEST_P(WholeModel, GradientsMatchFiniteDifferences) {
  const bool discrete = GetParam();
  auto ops = make_host_ops(Precision::Double);
  ModelSpec spec(check_config(), discrete);
  ArrayWeights w(*ops, spec);
  ModelOptions mo;
  mo.generate_batch = false;
  Model model(spec, *ops, mo);
  model.set_batch(check_tokens(), check_targets());
  model.microbatch(w, ops->stream());
  // The routing must exercise dropping: at least one token without a slot in some layer.
  const double loss0 = dptr(model.loss_slots())[0];
  EXPECT_GT(loss0, 0.5);
  auto loss = [&] {
    model.forward(w, ops->stream());
    return dptr(model.loss_slots())[0];
  };
  int checked = 0;
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor p = w.param(i), g = w.grad(i);
    std::vector<double> vals(dptr(p), dptr(p) + p.numel);
    // Up to 7 elements per parameter, spread over it.
    const std::int64_t step = std::max<std::int64_t>(1, p.numel / 7);
    for (std::int64_t j = 0; j < p.numel; j += step) {
      auto f = [&] {
        std::copy(vals.begin(), vals.end(), dptr(p));
        return loss();
      };
      const double numeric = central(vals, static_cast<std::size_t>(j), f, 1e-6);
      std::copy(vals.begin(), vals.end(), dptr(p));
      const double analytic = dptr(g)[j];
      EXPECT_NEAR(analytic, numeric, 2e-7 * std::max(1e-2, std::fabs(numeric)))
          << spec.params()[static_cast<std::size_t>(i)].name << " element " << j;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
  // The loss of the last forward (unperturbed) equals the first.
  EXPECT_NEAR(loss(), loss0, 1e-14);
}

TEST_P(WholeModel, PerParameterSumOfSquaresIsTheGradientNorm) {
  auto ops = make_host_ops(Precision::Double);
  ModelSpec spec(check_config(), GetParam());
  ArrayWeights w(*ops, spec);
  ModelOptions mo;
  mo.generate_batch = false;
  Model model(spec, *ops, mo);
  model.set_batch(check_tokens(), check_targets());
  model.microbatch(w, ops->stream());
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor g = w.grad(i);
    double s = 0;
    for (std::int64_t j = 0; j < g.numel; ++j) s += dptr(g)[j] * dptr(g)[j];
    EXPECT_NEAR(dptr(model.grad_sumsq())[i], s, 1e-12 * std::max(1.0, s)) << spec.params()[static_cast<std::size_t>(i)].name;
    const ParamKind kind = spec.params()[static_cast<std::size_t>(i)].kind;
    if (kind != ParamKind::ExpertUp && kind != ParamKind::ExpertDown) {  // an expert may get no token
      EXPECT_GT(s, 0.0) << spec.params()[static_cast<std::size_t>(i)].name << " gets no gradient";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Experts, WholeModel, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "discrete" : "single"; });

TEST(TrainerModel, SingleAndDiscreteExpertsGiveIdenticalGradients) {
  auto ops = make_host_ops(Precision::Mixed);
  ModelSpec single(check_config(), false), discrete(check_config(), true);
  ArrayWeights ws(*ops, single), wd(*ops, discrete);
  ModelOptions mo;
  mo.generate_batch = false;
  Model ms(single, *ops, mo), md(discrete, *ops, mo);
  ms.set_batch(check_tokens(), check_targets());
  md.set_batch(check_tokens(), check_targets());
  ms.microbatch(ws, ops->stream());
  md.microbatch(wd, ops->stream());
  EXPECT_EQ(ms.loss_slots().as<float>()[0], md.loss_slots().as<float>()[0]);
  for (std::size_t l = 0; l < single.blocks().size(); ++l) {
    for (int g = 0; g < single.config().experts; ++g) {
      for (int which = 0; which < 2; ++which) {
        const int gi = which == 0 ? single.blocks()[l].expert_up[0] : single.blocks()[l].expert_down[0];
        const int di = which == 0 ? discrete.blocks()[l].expert_up[static_cast<std::size_t>(g)]
                                  : discrete.blocks()[l].expert_down[static_cast<std::size_t>(g)];
        const Tensor a = ws.param(gi, g), b = wd.param(di);
        ASSERT_EQ(0, std::memcmp(a.data, b.data, a.bytes())) << "same initial values, layer " << l << " expert " << g;
        const Tensor ga = ws.grad(gi, g), gb = wd.grad(di);
        ASSERT_EQ(0, std::memcmp(ga.data, gb.data, ga.bytes())) << "same gradient bits, layer " << l << " expert " << g;
      }
    }
  }
}

TEST(TrainerModel, WeightGradientsAccumulateAcrossMicrobatches) {
  // Every gradient is accumulated (beta = 1 GEMMs, += for norms and the embedding): the
  // same microbatch twice gives exactly twice the gradient of once (x + x is exact).
  auto ops = make_host_ops(Precision::Mixed);
  ModelSpec spec(check_config(), true);
  ArrayWeights once(*ops, spec), twice(*ops, spec);
  ModelOptions mo;
  mo.generate_batch = false;
  mo.microbatches = 2;
  Model m(spec, *ops, mo);
  m.set_batch(check_tokens(), check_targets());
  m.microbatch(once, ops->stream());
  m.microbatch(twice, ops->stream());
  m.microbatch(twice, ops->stream());
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor a = once.grad(i), b = twice.grad(i);
    for (std::int64_t j = 0; j < a.numel; ++j)
      ASSERT_EQ(2.0f * a.as<float>()[j], b.as<float>()[j]) << spec.params()[static_cast<std::size_t>(i)].name << " " << j;
  }
}

TEST(TrainerModel, MixedPrecisionHostModelTracksTheDoubleModel) {
  // The double model's parameters are set to the bf16 values the mixed model starts from,
  // so the two differ only by bf16 activations and fp32 accumulation.
  auto dops = make_host_ops(Precision::Double);
  auto mops = make_host_ops(Precision::Mixed);
  ModelSpec spec(check_config(), false);
  ArrayWeights wd(*dops, spec), wm(*mops, spec);
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor d = wd.param(i), m = wm.param(i);
    for (std::int64_t j = 0; j < d.numel; ++j) dptr(d)[j] = math::from_bf16(m.as<std::uint16_t>()[j]);
  }
  ModelOptions mo;
  mo.generate_batch = false;
  Model md(spec, *dops, mo), mm(spec, *mops, mo);
  md.set_batch(check_tokens(), check_targets());
  mm.set_batch(check_tokens(), check_targets());
  md.microbatch(wd, dops->stream());
  mm.microbatch(wm, mops->stream());
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

TEST(TrainerConfig, SizesAndOptions) {
  EXPECT_NEAR(static_cast<double>(model_size("1b").param_count()), 1.06e9, 0.01e9);
  EXPECT_EQ(model_size("tiny").capacity(), 20);
  const TrainOptions o = parse_options({"--size", "tiny", "--mode=fsdp", "--graph", "off", "--hidden", "16"});
  EXPECT_EQ(o.mode, "fsdp");
  EXPECT_FALSE(o.graph);
  EXPECT_EQ(o.model.hidden, 16);
  EXPECT_THROW(parse_options({"--mode", "zero3"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--steps"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--num-experts", "65"}), std::invalid_argument);
  EXPECT_EQ(rule_multiplier(64), 5);
  EXPECT_EQ(rule_multiplier(128256), 5);
  EXPECT_EQ(rule_multiplier(10), 7);
}

TEST(TrainerConfig, DiscreteAndGroupedExpertsStartEqual) {
  ModelSpec s(check_config(), false), d(check_config(), true);
  const int gi = s.blocks()[1].expert_down[0], di = d.blocks()[1].expert_down[2];
  for (std::int64_t j = 0; j < 48; ++j) EXPECT_EQ(s.init_value(gi, 2, j), d.init_value(di, -1, j));
  EXPECT_NE(s.init_value(gi, 1, 0), s.init_value(gi, 2, 0));
  EXPECT_EQ(s.units().size(), 4u);
  EXPECT_EQ(d.units()[1].count, 5 + 2 * 3);
}

}  // namespace
}  // namespace trainer
