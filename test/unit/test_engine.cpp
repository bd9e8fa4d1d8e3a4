// The shared sharded-Adam engine through its two front ends, on the host backend with
// one rank: the Adam settings reach the kernels as the doubles the trainer wrote (an
// independent double-precision AdamW is the oracle), and a moved-from DistributedAdam,
// Fsdp or StepGraph refuses every call with a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <random>
#include <string>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace {
using namespace shardopt;

std::vector<ParamSpec> one_matrix() { return {ParamSpec::tensor("w", {37, 29}, DType::f32)}; }

/// Plain double-precision AdamW, written from its definition (torch.optim.AdamW): decay
/// first, then the moments, then the bias-corrected update.
struct DoubleAdamW {
  double beta1, beta2, eps, lr, wd;
  std::vector<double> p, m, v;
  void step(const std::vector<double>& g, int t) {
    const double bc1 = 1.0 - std::pow(beta1, t), bc2 = 1.0 - std::pow(beta2, t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * wd;
      m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
      p[i] -= (lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

std::vector<float> read_f32(const ShardView& v) {
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  if (!out.empty()) std::memcpy(out.data(), v.data, out.size() * sizeof(float));
  return out;
}

// AdamW with beta2 = 0.999 through DistributedAdam matches the double oracle within the
// fused kernel's documented bound (docs/fused_adam.md): after T steps |p - p_ref| <= T *
// (2 ulp(p) + 1e-5 lr) and v within 1e-5 v. With beta2 rounded to float on the way
// (1 - 0.999f = 0.00099998713), v is off by 1.3e-5 relative from the first step on.
TEST(Engine, AdamSettingsReachTheKernelsAsDoubles) {
  DistributedAdamOptions o;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  o.grad_dtype = DType::f32;
  o.default_group = AdamGroup{0.01, 1.0};
  const double lr = 1e-3;
  DistributedAdam opt(Communicator::self(Backend::Host), one_matrix(), o);
  opt.set_lr(static_cast<float>(lr));
  HostStream s;
  const std::size_t n = 37 * 29;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  DoubleAdamW ref{o.beta1, o.beta2, o.eps, lr, 0.01, {}, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  {
    std::vector<float> init(n);
    for (auto& x : init) x = static_cast<float>(normal(rng));
    std::memcpy(opt.param(0).data, init.data(), n * sizeof(float));
    ref.p.assign(init.begin(), init.end());
  }
  opt.init_master(s.handle());
  const int steps = 10;
  for (int t = 1; t <= steps; ++t) {
    std::vector<float> g(n);
    for (auto& x : g) x = static_cast<float>(normal(rng) * std::pow(10.0, static_cast<double>(t % 3) - 1.0));
    std::memcpy(opt.grad(0).data, g.data(), n * sizeof(float));
    opt.step(s.handle());
    opt.zero_grad(s.handle());
    ref.step(std::vector<double>(g.begin(), g.end()), t);
  }
  const auto p = read_f32(opt.shard_master(0));
  const auto v = read_f32(opt.shard_exp_avg_sq(0));
  ASSERT_EQ(p.size(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const double ulp = std::nextafter(std::fabs(ref.p[i]), INFINITY) - std::fabs(ref.p[i]);
    ASSERT_LE(std::fabs(p[i] - ref.p[i]), steps * (2.0 * std::max(ulp, 1.2e-7 * std::fabs(ref.p[i])) + 1e-5 * lr))
        << "param element " << i;
    ASSERT_LE(std::fabs(v[i] - ref.v[i]), 1e-5 * ref.v[i]) << "exp_avg_sq element " << i;
  }
}

// Both options structs carry the same AdamOptions, as doubles.
TEST(Engine, BothOptionsShareAdamOptions) {
  DistributedAdamOptions d;
  FsdpOptions f;
  const AdamOptions& da = d;
  const AdamOptions& fa = f;
  EXPECT_EQ(da.beta2, 0.999);
  EXPECT_EQ(fa.beta2, 0.999);
  EXPECT_EQ(1.0 - d.beta2, 1.0 - 0.999);  // no float on the way
  static_assert(std::is_same_v<decltype(AdamOptions::beta1), double>);
  static_assert(std::is_same_v<decltype(AdamOptions::eps), double>);
}

void expect_moved_from(const std::function<void()>& call, const std::string& what) {
  try {
    call();
    FAIL() << "a call on a moved-from " << what << " did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidState);
    EXPECT_NE(std::string(e.what()).find("this " + what + " was moved from"), std::string::npos) << e.what();
  }
}

TEST(Engine, MovedFromDistributedAdamIsAClearError) {
  DistributedAdam a(Communicator::self(Backend::Host), one_matrix());
  DistributedAdam b(std::move(a));
  HostStream s;
  expect_moved_from([&] { (void)a.layout(); }, "DistributedAdam");
  expect_moved_from([&] { (void)a.num_params(); }, "DistributedAdam");
  expect_moved_from([&] { (void)a.param(0); }, "DistributedAdam");
  expect_moved_from([&] { a.step(s.handle()); }, "DistributedAdam");
  expect_moved_from([&] { a.zero_grad(s.handle()); }, "DistributedAdam");
  expect_moved_from([&] { (void)a.device_scalars(); }, "DistributedAdam");
  expect_moved_from([&] { (void)a.memory(); }, "DistributedAdam");
  EXPECT_EQ(b.num_params(), 1);  // the one it moved to works
  b.init_master(s.handle());
  b.step(s.handle());
  EXPECT_EQ(b.read_scalars(s.handle()).step, 1);
  a = std::move(b);  // a moved-from object may be assigned to
  EXPECT_EQ(a.num_params(), 1);
}

TEST(Engine, MovedFromFsdpIsAClearError) {
  FsdpOptions fo;
  fo.param_dtype = DType::f32;  // one_matrix() is f32
  Fsdp a(Communicator::self(Backend::Host), one_matrix(), {FsdpUnit{"all", 0, 1}}, fo);
  Fsdp b(std::move(a));
  HostStream s;
  expect_moved_from([&] { (void)a.layout(); }, "Fsdp");
  expect_moved_from([&] { (void)a.num_units(); }, "Fsdp");
  expect_moved_from([&] { (void)a.wait_param(0, s.handle()); }, "Fsdp");
  expect_moved_from([&] { a.step(s.handle()); }, "Fsdp");
  expect_moved_from([&] { (void)a.shard_master(0); }, "Fsdp");
  EXPECT_EQ(b.num_units(), 1);
}

TEST(Engine, MovedFromStepGraphIsAClearError) {
  DistributedAdam opt(Communicator::self(Backend::Host), one_matrix());
  HostStream s;
  opt.init_master(s.handle());
  StepGraph a(opt, [](Stream, bool) {});
  StepGraph b(std::move(a));
  expect_moved_from([&] { a.capture(s.handle()); }, "StepGraph");
  expect_moved_from([&] { (void)a.captured(); }, "StepGraph");
  expect_moved_from([&] { a.replay(s.handle()); }, "StepGraph");
  b.capture(s.handle());
  EXPECT_TRUE(b.captured());
  b.replay(s.handle());
  // The graph follows its optimizer when the optimizer object moves.
  DistributedAdam moved(std::move(opt));
  b.replay(s.handle());
  EXPECT_EQ(moved.read_scalars(s.handle()).step, 3);  // warm-up + two replays
}

}  // namespace
