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
#include <stdexcept>
#include <string>
#include <vector>

#include <shardopt/host_stream.hpp>
#include <shardopt/mxfp8.hpp>

#include "host_ops.hpp"
#include "model.hpp"
#include "model_spec.hpp"
#include "state_precision.hpp"
#include "trainer_check_util.hpp"
#include "weights.hpp"

namespace trainer {
namespace {

using namespace check;

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

class WholeModel : public ::testing::TestWithParam<bool> {};

TEST_P(WholeModel, GradientsMatchFiniteDifferences) {
  // The routing must exercise dropping: at least one token without a slot in some layer.
  auto ops = make_host_ops(Precision::Double);
  ModelSpec spec(check_config(), GetParam());
  ArrayWeights w(*ops, spec);
  expect_model_gradients_match_finite_differences(spec, *ops, w, check_tokens(), check_targets(), 7, 100);
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
  expect_mixed_tracks_double(spec, *dops, wd, *mops, wm, check_tokens(), check_targets());
}

// ---------------------------------------------------------------- MXFP8 weights for compute

/// e4m3 byte -> value, from the format's definition (sign, 4 exponent bits with bias 7,
/// 3 mantissa bits; exponent 0 is subnormal; S.1111.111 is NaN; no infinities).
double e4m3_value(std::uint8_t b) {
  if ((b & 0x7F) == 0x7F) return std::nan("");
  const double sign = (b & 0x80) != 0 ? -1.0 : 1.0;
  const int e = (b >> 3) & 0xF, m = b & 7;
  return sign * (e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
}

/// A value -> bf16 bits, round to nearest even, with bf16 subnormals (spacing 2^-133) and
/// overflow to Inf; NaN -> 0x7FC0.
std::uint16_t bf16_bits_of(double v) {
  if (std::isnan(v)) return 0x7FC0;
  const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int q = std::max(e - 1 - 7, -133);
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, -q)), q);  // ties to even
  if (r >= 0x1p128) return sign | 0x7F80;
  const float f = static_cast<float>(r);  // exact: at most 8 significant bits
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<std::uint16_t>(sign | (u >> 16));
}

/// The expected bf16 compute value of an MXFP8 element (data byte, scale byte).
std::uint16_t expected_bf16(std::uint8_t d, std::uint8_t s) {
  if (s == 0xFF) return 0x7FC0;
  return bf16_bits_of(e4m3_value(d) * std::ldexp(1.0, static_cast<int>(s) - 127));
}

/// One MXFP8 source in host memory: random data bytes (every code), scale bytes over the
/// whole range (0x00 = 2^-127, 0xFE, 0xFF = NaN included), members stored in reverse order
/// behind a member table when `permuted`.
struct HostMxfp8 {
  shardopt::Mxfp8Shape shape;
  std::vector<std::uint8_t> data, scale;
  std::vector<shardopt::Mxfp8Member> table;
  HostMxfp8(std::int64_t G, std::int64_t rows, std::int64_t cols, bool permuted, std::uint32_t seed)
      : shape{G, rows, cols} {
    std::mt19937 gen(seed);
    data.resize(static_cast<std::size_t>(shape.numel()));
    scale.resize(static_cast<std::size_t>(shape.scale_row_numel()));
    for (auto& b : data) b = static_cast<std::uint8_t>(gen());
    for (std::size_t k = 0; k < scale.size(); ++k)
      scale[k] = k % 5 == 0 ? static_cast<std::uint8_t>(gen()) : static_cast<std::uint8_t>(0x70 + gen() % 24);
    if (permuted)
      for (std::int64_t g = 0; g < G; ++g)
        table.push_back({(G - 1 - g) * shape.member_numel(), (G - 1 - g) * rows * shape.row_blocks(), 0});
  }
  Mxfp8Source source() const { return {shape, data.data(), scale.data(), table.empty() ? nullptr : table.data()}; }
  /// Element (g, r, c) decoded by the independent rule above.
  std::uint16_t expected(std::int64_t g, std::int64_t r, std::int64_t c) const {
    const std::int64_t slot = table.empty() ? g : shape.members - 1 - g;
    const std::uint8_t d = data[static_cast<std::size_t>(slot * shape.member_numel() + r * shape.cols + c)];
    const std::uint8_t s = scale[static_cast<std::size_t>(slot * shape.rows * shape.row_blocks() + r * shape.row_blocks() +
                                                          c / 32)];
    return expected_bf16(d, s);
  }
};

TEST(TrainerOps, DequantizeMxfp8MatchesAnIndependentDecode) {
  // Exhaustive over the element byte for a few scales first (the rule itself).
  for (int s : {0x00, 0x01, 0x40, 0x70, 0x7F, 0x86, 0xF0, 0xFE, 0xFF})
    for (int d = 0; d < 256; ++d)
      ASSERT_EQ(math::mxfp8_to_bf16(static_cast<std::uint8_t>(d), static_cast<std::uint8_t>(s)),
                expected_bf16(static_cast<std::uint8_t>(d), static_cast<std::uint8_t>(s)))
          << "data 0x" << std::hex << d << " scale 0x" << s;
  // The op: several sources into one output, rows of 40 (runs of 8, a partial 32-block),
  // of 7 (single elements), grouped members behind a permuted member table.
  auto ops = make_host_ops(Precision::Mixed);
  const std::vector<HostMxfp8> src = {HostMxfp8(1, 5, 40, false, 1), HostMxfp8(3, 4, 7, false, 2),
                                      HostMxfp8(2, 3, 64, true, 3)};
  std::vector<Mxfp8Source> sources;
  std::int64_t total = 0;
  for (const HostMxfp8& h : src) {
    sources.push_back(h.source());
    total += h.shape.numel();
  }
  Buffer out = ops->alloc(Elem::bf16, total);
  ops->dequantize_mxfp8(sources, out, nullptr, ops->stream());
  ops->synchronize();
  const std::uint16_t* got = out.as<std::uint16_t>();
  std::int64_t at = 0;
  for (std::size_t k = 0; k < src.size(); ++k) {
    const auto& sh = src[k].shape;
    for (std::int64_t g = 0; g < sh.members; ++g)
      for (std::int64_t r = 0; r < sh.rows; ++r)
        for (std::int64_t c = 0; c < sh.cols; ++c, ++at)
          ASSERT_EQ(got[at], src[k].expected(g, r, c)) << "source " << k << " (" << g << ", " << r << ", " << c << ")";
  }
  Buffer wrong = ops->alloc(Elem::bf16, total - 1);
  EXPECT_THROW(ops->dequantize_mxfp8(sources, wrong, nullptr, ops->stream()), std::invalid_argument);
  Buffer f32 = ops->alloc(Elem::f32, total);
  EXPECT_THROW(ops->dequantize_mxfp8(sources, f32, nullptr, ops->stream()), std::invalid_argument);
}

// The columnwise plane (FSDP's backward): element (g, r, c) scaled by the byte of its
// 32-row block of column c, members contiguous or behind a permuted table.
TEST(TrainerOps, DequantizeMxfp8ColumnwiseMatchesAnIndependentDecode) {
  auto ops = make_host_ops(Precision::Mixed);
  for (bool permuted : {false, true}) {
    const shardopt::Mxfp8Shape sh{2, 37, 9};  // a partial 32-row block
    std::mt19937 gen(permuted ? 7 : 8);
    std::vector<std::uint8_t> data(static_cast<std::size_t>(sh.numel())), scale(static_cast<std::size_t>(sh.scale_col_numel()));
    for (auto& b : data) b = static_cast<std::uint8_t>(gen());
    for (std::size_t k = 0; k < scale.size(); ++k)
      scale[k] = k % 5 == 0 ? static_cast<std::uint8_t>(gen()) : static_cast<std::uint8_t>(0x70 + gen() % 24);
    std::vector<shardopt::Mxfp8Member> table;
    if (permuted)
      for (std::int64_t g = 0; g < sh.members; ++g)
        table.push_back({(sh.members - 1 - g) * sh.member_numel(), 0, (sh.members - 1 - g) * sh.col_blocks() * sh.cols});
    Mxfp8Source src{sh, data.data(), scale.data(), table.empty() ? nullptr : table.data(),
                    shardopt::Mxfp8Plane::Columnwise};
    Buffer out = ops->alloc(Elem::bf16, sh.numel());
    ops->dequantize_mxfp8({src}, out, nullptr, ops->stream());
    ops->synchronize();
    const std::uint16_t* got = out.as<std::uint16_t>();
    for (std::int64_t g = 0; g < sh.members; ++g) {
      const std::int64_t slot = permuted ? sh.members - 1 - g : g;
      for (std::int64_t r = 0; r < sh.rows; ++r)
        for (std::int64_t c = 0; c < sh.cols; ++c) {
          const std::uint8_t d = data[static_cast<std::size_t>(slot * sh.member_numel() + r * sh.cols + c)];
          const std::uint8_t s = scale[static_cast<std::size_t>((slot * sh.col_blocks() + r / 32) * sh.cols + c)];
          ASSERT_EQ(got[g * sh.member_numel() + r * sh.cols + c], expected_bf16(d, s)) << g << " " << r << " " << c;
        }
    }
  }
}

TEST(TrainerOps, DequantizeMxfp8ReadsTheSkipFlagWhenTheCaptureRuns) {
  // Seed 000 at the op level on the host backend: one captured op serves every microbatch;
  // it decodes when the flag (read at replay) says the weights changed, else keeps the copy.
  auto ops = make_host_ops(Precision::Mixed);
  HostMxfp8 w(1, 2, 32, false, 4);
  for (auto& s : w.scale) s = 0x7F;  // 2^0: finite values
  Buffer out = ops->alloc(Elem::bf16, w.shape.numel());
  shardopt::MicrobatchState state{};
  shardopt::HostStream* hs = shardopt::HostStream::from(ops->stream());
  ASSERT_NE(hs, nullptr);
  hs->begin_capture();
  ops->dequantize_mxfp8({w.source()}, out, &state, ops->stream());
  const shardopt::HostGraph graph = hs->end_capture();
  auto replay = [&](std::uint8_t fill, int skip) {
    std::fill(w.data.begin(), w.data.end(), fill);
    state.skip_weight_update = skip;
    graph.replay();
    return std::vector<std::uint16_t>(out.as<std::uint16_t>(), out.as<std::uint16_t>() + w.shape.numel());
  };
  const std::vector<std::uint16_t> one(static_cast<std::size_t>(w.shape.numel()), math::to_bf16(1.0f)),
      two(static_cast<std::size_t>(w.shape.numel()), math::to_bf16(2.0f));
  EXPECT_EQ(replay(0x38, 0), one) << "first microbatch: decoded (0x38 = 1.0)";
  EXPECT_EQ(replay(0x40, 1), one) << "later microbatch: this step's copy is kept";
  EXPECT_EQ(replay(0x40, 0), two) << "next step's first microbatch: decoded again (0x40 = 2.0)";
}

TEST(TrainerOps, InitParamWritesTheF32ValuesTheBf16OnesRoundFrom) {
  auto ops = make_host_ops(Precision::Mixed);
  ModelSpec spec(check_config(), false);
  for (int i = 0; i < spec.num_params(); ++i) {
    InitArgs a = spec.init_args(i);
    a.offset = 3;  // a master piece starting inside the tensor
    const std::int64_t n = 20;
    Buffer f = ops->alloc(Elem::f32, n), b = ops->alloc(Elem::bf16, n);
    ops->init_param(f, a, ops->stream());
    ops->init_param(b, a, ops->stream());
    ops->synchronize();
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t q = 3 + j;
      const ParamInfo& p = spec.params()[static_cast<std::size_t>(i)];
      const std::int64_t mn = shardopt::numel(p.shape);
      ASSERT_EQ(f.as<float>()[j], spec.init_value(i, p.members > 1 ? static_cast<int>(q / mn) : -1, q % mn)) << p.name;
      ASSERT_EQ(b.as<std::uint16_t>()[j], math::to_bf16(f.as<float>()[j])) << p.name;
    }
  }
}

/// MXFP8 weights for a host model: the 2-D parameters of `ref` quantized with the library
/// (quantize_mxfp8 of their bf16 values; grouped ones through a member table), the 1-D ones
/// as f32 (the library keeps them native f32), gradients of their own. `ref`'s 2-D
/// parameters are then overwritten with bf16(dequantize_mxfp8(rowwise plane)): the bf16
/// model that the MXFP8 model must equal bitwise.
class Mxfp8ArrayWeights final : public Weights {
 public:
  Mxfp8ArrayWeights(Ops& ops, const ModelSpec& spec, ArrayWeights& ref) : spec_(spec), grads_(ops, spec) {
    const shardopt::Stream s = ops.stream();
    for (int i = 0; i < spec.num_params(); ++i) {
      const ParamInfo& p = spec.params()[static_cast<std::size_t>(i)];
      const Tensor r = ref.param(i);
      Entry e;
      if (p.shape.size() < 2) {
        e.f32 = ops.alloc(Elem::f32, r.numel);
        for (std::int64_t j = 0; j < r.numel; ++j) e.f32.as<float>()[j] = math::from_bf16(r.as<std::uint16_t>()[j]);
        entries_.push_back(std::move(e));
        continue;
      }
      shardopt::Shape whole = p.shape;
      if (p.members > 1) whole.insert(whole.begin(), p.members);
      e.shape = shardopt::Mxfp8Shape::of(whole, p.members);
      e.data_row = ops.alloc(Elem::u8, e.shape.numel());
      e.data_col = ops.alloc(Elem::u8, e.shape.numel());
      e.scale_row = ops.alloc(Elem::u8, e.shape.scale_row_numel());
      e.scale_col = ops.alloc(Elem::u8, e.shape.scale_col_numel());
      const shardopt::Mxfp8Planes planes{e.data_row.as<std::uint8_t>(), e.scale_row.as<std::uint8_t>(),
                                         e.data_col.as<std::uint8_t>(), e.scale_col.as<std::uint8_t>()};
      shardopt::quantize_mxfp8(e.shape, r.as<std::uint16_t>(), planes, nullptr, shardopt::Backend::Host, s);
      if (p.members > 1) e.table = shardopt::mxfp8_contiguous_members(e.shape);
      Buffer decoded = ops.alloc(Elem::f32, r.numel);
      shardopt::dequantize_mxfp8(e.shape, shardopt::Mxfp8Plane::Rowwise, planes.data_row, planes.scale_row,
                                 decoded.as<float>(), shardopt::Backend::Host, s);
      ops.synchronize();
      for (std::int64_t j = 0; j < r.numel; ++j) r.as<std::uint16_t>()[j] = math::to_bf16(decoded.as<float>()[j]);
      entries_.push_back(std::move(e));
    }
  }
  void forward_unit(int, Stream) override {}
  void backward_unit(int, bool, Stream) override {}
  void backward_unit_done(int, Stream) override {}
  void grad_done(int, Stream) override {}
  Tensor param(int i, int member = -1) override {
    if (is_mxfp8(i)) throw std::logic_error("MXFP8 parameter read as bf16");
    EXPECT_LT(member, 0);
    return entries_[static_cast<std::size_t>(i)].f32.get();
  }
  Tensor grad(int i, int member = -1) override { return grads_.grad(i, member); }
  bool is_mxfp8(int i) const override { return entries_[static_cast<std::size_t>(i)].f32.get().data == nullptr; }
  Mxfp8Source mxfp8(int i) const override {
    const Entry& e = entries_[static_cast<std::size_t>(i)];
    return {e.shape, e.data_row.as<std::uint8_t>(), e.scale_row.as<std::uint8_t>(),
            e.table.empty() ? nullptr : e.table.data()};
  }
  bool persistent() const noexcept override { return true; }
  SumsqWhen sumsq_when() const noexcept override { return SumsqWhen::LastMicrobatch; }
  /// Scrambles every MXFP8 weight (so a decode that should have been skipped shows).
  void scramble() {
    for (Entry& e : entries_)
      if (e.f32.get().data == nullptr) std::memset(e.data_row.get().data, 0x41, e.data_row.get().bytes());
  }

 private:
  struct Entry {
    Buffer f32;  // 1-D parameters
    shardopt::Mxfp8Shape shape;
    Buffer data_row, scale_row, data_col, scale_col;
    std::vector<shardopt::Mxfp8Member> table;
  };
  const ModelSpec& spec_;
  ArrayWeights grads_;
  std::vector<Entry> entries_;
};

class Mxfp8Model : public ::testing::TestWithParam<bool> {};

TEST_P(Mxfp8Model, EqualsTheBf16ModelOfTheDecodedWeightsBitwise) {
  // The model with MXFP8 weights (ModelOptions::mxfp8_params) computes exactly what the bf16
  // model computes with bf16(dequantize(rowwise plane)) as its weights and the norm weights
  // in f32 instead of bf16 (the same values): every GEMM, the embedding and both norms read
  // the decoded weights, forward and backward. Loss and every gradient, bitwise.
  const bool discrete = GetParam();
  auto ops = make_host_ops(Precision::Mixed);
  ModelSpec spec(check_config(), discrete);
  ArrayWeights ref(*ops, spec);
  Mxfp8ArrayWeights mx(*ops, spec, ref);
  shardopt::MicrobatchState state{};  // the first microbatch of a step: decode
  ModelOptions mo;
  mo.generate_batch = false;
  Model mref(spec, *ops, mo);
  mo.mxfp8_params = true;
  mo.microbatch = &state;
  Model mmx(spec, *ops, mo);
  mref.set_batch(check_tokens(), check_targets());
  mmx.set_batch(check_tokens(), check_targets());
  mref.microbatch(ref, ops->stream());
  mmx.microbatch(mx, ops->stream());
  ops->synchronize();
  EXPECT_EQ(mref.loss_slots().as<float>()[0], mmx.loss_slots().as<float>()[0]);
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor a = ref.grad(i), b = mx.grad(i);
    ASSERT_EQ(0, std::memcmp(a.data, b.data, a.bytes())) << spec.params()[static_cast<std::size_t>(i)].name;
    if (mx.is_mxfp8(i)) {
      const Tensor c = mmx.compute_buffer(i), r = ref.param(i);
      ASSERT_EQ(0, std::memcmp(c.data, r.data, r.bytes())) << "compute buffer of " << spec.params()[static_cast<std::size_t>(i)].name;
    }
  }
  // A later microbatch (skip_weight_update = 1) keeps the step's decoded weights even if the
  // MXFP8 bytes changed: the gradients accumulate to exactly twice.
  state.first = 0;
  state.skip_weight_update = 1;
  mx.scramble();
  mmx.microbatch(mx, ops->stream());
  ops->synchronize();
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor a = ref.grad(i), b = mx.grad(i);
    for (std::int64_t j = 0; j < a.numel; ++j)
      ASSERT_EQ(2.0f * a.as<float>()[j], b.as<float>()[j]) << spec.params()[static_cast<std::size_t>(i)].name << " " << j;
  }
  // The next step's first microbatch decodes again (the scrambled bytes now show).
  state.first = 1;
  state.skip_weight_update = 0;
  mmx.microbatch(mx, ops->stream());
  ops->synchronize();
  EXPECT_EQ(mmx.compute_buffer(spec.head()).as<std::uint16_t>()[0], math::mxfp8_to_bf16(0x41, mx.mxfp8(spec.head()).scale[0]));
}

INSTANTIATE_TEST_SUITE_P(Experts, Mxfp8Model, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "discrete" : "single"; });

TEST(TrainerModel, Mxfp8ParametersNeedMixedPrecisionWeights) {
  auto ops = make_host_ops(Precision::Mixed);
  ModelSpec spec(check_config(), true);
  ModelOptions mo;
  mo.mxfp8_params = true;
  mo.gathered_weights = true;  // FSDP's MXFP8 weights are decoded per use
  EXPECT_NO_THROW(Model(spec, *ops, mo));
  mo.mxfp8_params = false;
  mo.nvfp4_params = true;  // NVFP4 weights are DistributedAdam's only
  EXPECT_THROW(Model(spec, *ops, mo), std::invalid_argument);
  mo.nvfp4_params = false;
  mo.mxfp8_params = true;
  auto dops = make_host_ops(Precision::Double);
  mo.gathered_weights = false;
  EXPECT_THROW(Model(spec, *dops, mo), std::invalid_argument);
  // Bf16 weights given to a model built for MXFP8 (or the other way round) are refused.
  ArrayWeights w(*ops, spec);
  mo.generate_batch = false;
  Model m(spec, *ops, mo);
  m.set_batch(check_tokens(), check_targets());
  EXPECT_THROW(m.forward(w, ops->stream()), std::logic_error);
}

// The message of the std::invalid_argument that `parse` throws on `args`, or "(accepted)".
template <class Parse>
std::string refusal(Parse parse, const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
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

TEST(TrainerConfig, CheckpointOptions) {
  const TrainOptions d = parse_options({});
  EXPECT_TRUE(d.save_dir.empty());
  EXPECT_EQ(d.save_every, 0);
  EXPECT_TRUE(d.resume.empty());
  const TrainOptions o = parse_options({"--save-dir", "out/ckpt", "--save-every=10", "--resume", "old/step-00030"});
  EXPECT_EQ(o.save_dir, "out/ckpt");
  EXPECT_EQ(o.save_every, 10);
  EXPECT_EQ(o.resume, "old/step-00030");
  auto message = [](const std::vector<std::string>& args) { return refusal(parse_options, args); };
  EXPECT_NE(message({"--save-dir", "d", "--save-every", "0"}).find("at least 1"), std::string::npos);
  EXPECT_NE(message({"--save-dir", "d", "--save-every", "-3"}).find("at least 1"), std::string::npos);
  EXPECT_NE(message({"--save-dir", "d", "--save-every", "ten"}).find("takes an integer"), std::string::npos);
  EXPECT_NE(message({"--save-every", "5"}).find("needs --save-dir"), std::string::npos);
  EXPECT_NE(message({"--save-dir="}).find("needs a directory"), std::string::npos);
  EXPECT_NE(message({"--resume="}).find("needs a checkpoint directory"), std::string::npos);
  EXPECT_NE(message({"--resume"}).find("needs a value"), std::string::npos);
  EXPECT_EQ(checkpoint_dir("out/ckpt", 10), "out/ckpt/step-00010");
  EXPECT_EQ(checkpoint_dir("out/ckpt/", 123456), "out/ckpt/step-123456");
  EXPECT_NE(usage().find("--save-every"), std::string::npos);
  EXPECT_NE(usage().find("--resume"), std::string::npos);
}

TEST(TrainerConfig, CommandLineOfTheProgram) {
  // CLI11 (cli.cpp): the program's own options, --help winning over bad input, the choice
  // tables of --master / --moments, and the help text generated from the declarations.
  const CommandLine l = parse_command_line({"--metrics", "m.jsonl", "--save-init=init", "--expect-loss-below", "0.05",
                                            "--expect-val-loss-below=1.5", "--master", "remainder", "--moments=bf16",
                                            "--steps", "3", "--steps", "7", "--quiet"});
  EXPECT_FALSE(l.help);
  EXPECT_EQ(l.program.metrics_path, "m.jsonl");
  EXPECT_EQ(l.program.save_init, "init");
  EXPECT_DOUBLE_EQ(l.program.expect_loss_below, 0.05);
  EXPECT_DOUBLE_EQ(l.program.expect_val_loss_below, 1.5);
  EXPECT_EQ(l.train.master, "remainder");
  EXPECT_EQ(l.train.moments, "bf16");
  EXPECT_EQ(l.train.steps, 7);  // the last one given wins
  EXPECT_TRUE(l.train.quiet);
  EXPECT_TRUE(parse_command_line({"--steps", "ten", "--help"}).help);
  EXPECT_TRUE(parse_command_line({"-h"}).help);
  EXPECT_EQ(parse_command_line({}).program.expect_loss_below, -1.0);
  EXPECT_THROW(parse_options({"--metrics", "m.jsonl"}), std::invalid_argument);  // the program's, not a run's
  auto message = [](const std::vector<std::string>& args) { return refusal(parse_command_line, args); };
  EXPECT_EQ(message({"--bogus"}), "unknown option '--bogus' (see --help)");
  EXPECT_EQ(message({"--moments", "int8"}), "--moments takes one of fp32, bf16, q8, not 'int8'");
  EXPECT_EQ(message({"--graph", "maybe"}), "--graph takes on or off, not 'maybe'");
  EXPECT_EQ(message({"--lr", "fast"}), "--lr takes a number, not 'fast'");
  EXPECT_EQ(message({"--offload", "1.5"}), "--offload takes a share in [0, 1], not '1.5'");
  EXPECT_DOUBLE_EQ(parse_command_line({"--offload", "0.25"}).train.offload, 0.25);
  EXPECT_EQ(message({"--steps", "99999999999"}), "--steps 99999999999 is out of range");
  EXPECT_EQ(message({"--timeout-ms", "-3"}), "--timeout-ms takes milliseconds >= 0 (0: off), not '-3'");
  EXPECT_EQ(message({"--expect-loss-below"}), "--expect-loss-below needs a value");
  const std::string help = usage();
  for (const char* flag : {"--size", "--model", "--master", "--moments", "--offload", "--metrics", "--expect-loss-below",
                           "--save-init", "--capacity-factor", "--quiet", "--help"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  for (const Choice<shardopt::MasterStorage>& c : kMasterChoices) EXPECT_NE(help.find(c.help), std::string::npos);
  EXPECT_EQ(help.find("host backend so far"), std::string::npos);  // Muon runs on GPUs too
}

TEST(TrainerConfig, GroupedExpertsAreNamedLikeDiscreteOnesInCheckpoints) {
  ModelSpec s(check_config(), false), d(check_config(), true);
  const std::vector<shardopt::ParamSpec> grouped = s.specs(), discrete = d.specs();
  const int gi = s.blocks()[1].expert_down[0];
  const shardopt::ParamSpec& g = grouped[static_cast<std::size_t>(gi)];
  EXPECT_EQ(g.name, "layers.1.experts.down");
  ASSERT_EQ(g.members(), check_config().experts);
  for (int m = 0; m < g.members(); ++m) {
    const int di = d.blocks()[1].expert_down[static_cast<std::size_t>(m)];
    EXPECT_EQ(g.member_name(m), discrete[static_cast<std::size_t>(di)].name);
    EXPECT_EQ(g.member_name(m), "layers.1.experts." + std::to_string(m) + ".down");
  }
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
