// The fused Adam step on the host backend (the host twin, which the GPU suite checks
// bitwise against the CUDA kernels) against a plain double-precision oracle written from
// DESIGN.md: every variant, 100 steps, two weight-decay groups, odd lengths, unaligned
// chunk boundaries; lr = 0 and 1e-12; huge and tiny gradients; NaN/Inf through the norm
// kernels (step skipped, state untouched); HostStream capture replays equal eager steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "adam_test_util.hpp"
#include "core/memory.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/host_stream.hpp"

namespace {
using namespace shardopt;
using namespace adamtest;

/// Distance of one fp32 ulp at |x|.
double ulp32(double x) {
  const float a = std::fabs(static_cast<float>(x));
  return static_cast<double>(std::nextafter(a, std::numeric_limits<float>::infinity()) - a);
}

/// Largest errors seen against the oracle, in units of each element's tolerance.
struct Worst {
  double p = 0, m = 0, v = 0;
  double mean_abs_p = 0;
};

/// Runs `steps` fused steps of `cfg` on `prob` (grads N(0,1) * 256 with inv_loss_scale
/// 1/256, clip 0.5 on every third step, lr from schedule_lr unless `lr_override` >= 0)
/// next to the oracle, and checks every element after the last step.
Worst run_against_oracle(const AdamConfig& cfg, const Problem& prob, int steps, float lr_override = -1.0f,
                         float grad_scale = 256.0f, float inv_loss_scale = 1.0f / 256.0f) {
  State st(prob, cfg, 1234);
  const std::vector<float> master0 = st.master;
  const Array m0 = st.exp_avg, v0 = st.exp_avg_sq;
  std::vector<OracleElem> orc(static_cast<std::size_t>(prob.shard_numel));
  for (std::int64_t i = 0; i < prob.shard_numel; ++i)
    orc[static_cast<std::size_t>(i)] = {st.master[static_cast<std::size_t>(i)], st.exp_avg.get(i), st.exp_avg_sq.get(i)};

  StepScalars sc;
  double lr_max = 0;
  for (int step = 0; step < steps; ++step) {
    random_grads(st.grads, 77 + static_cast<std::uint64_t>(step), grad_scale);
    StepInputs in;
    in.lr = lr_override >= 0.0f ? lr_override : schedule_lr(step);
    in.inv_loss_scale = inv_loss_scale;
    in.clip_coef = step % 3 == 0 ? 0.5f : 1.0f;
    lr_max = std::max(lr_max, static_cast<double>(in.lr));
    sc.lr = in.lr;
    sc.inv_loss_scale = in.inv_loss_scale;
    sc.clip_coef = in.clip_coef;
    fused_adam_step(cfg, st.pointers(prob), &sc, Backend::Host, nullptr);
    for (std::int64_t i = 0; i < prob.shard_numel; ++i) {
      const int g = prob.group[static_cast<std::size_t>(i)];
      if (g < 0) continue;
      oracle_step(cfg, g, step + 1, in, st.grads.get(prob.buffer_index[static_cast<std::size_t>(i)]),
                  orc[static_cast<std::size_t>(i)]);
    }
  }
  EXPECT_EQ(sc.step, steps);

  // Tolerances (per element, after `steps` steps):
  //  fp32 moments: each step our fp32 evaluation differs from the exactly rounded double
  //  one by at most ~1.5 ulp of p (decay product and final rounding, where the oracle
  //  rounds once) plus a relative 1e-6 of the update (about six fp32 roundings in m, v,
  //  sqrt, the scaling, eps and the division), and the update is below 10 * lr. Errors
  //  add at worst linearly: steps * (2 ulp(p) + 1e-5 * lr_max). m and v are contractive
  //  recursions of a few roundings each: relative 1e-5 (m also absolute 1e-7).
  //  bf16 moments: the oracle rounds its moments to bf16 too, so the two differ only
  //  where a rounding lands on the other side of a bf16 boundary; such a flip moves m or
  //  v by one bf16 ulp (2^-8 relative) and that step's update by at most 2^-8 of 10 lr.
  //  Bound: steps * (2 ulp(p) + 2^-8 * 10 * lr_max); m, v within 2^-6 relative (a few
  //  flips, decaying by beta each step).
  //  m can be small by cancellation, so its bound is absolute at the scale of the
  //  gradients G = grad_scale * inv_loss_scale: 1e-6 G for fp32; for bf16 two flips at the
  //  largest |m| (about G), 2^-7 G.
  const bool bf16m = cfg.moment_dtype == DType::bf16;
  const double gscale = static_cast<double>(grad_scale) * static_cast<double>(inv_loss_scale);
  const double upd = bf16m ? std::ldexp(10.0, -8) * lr_max : 1e-5 * lr_max;
  const double mv_rel = bf16m ? std::ldexp(1.0, -6) : 1e-5;
  const double m_abs = (bf16m ? std::ldexp(1.0, -7) : 1e-6) * gscale;
  Worst w;
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < prob.shard_numel; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const int g = prob.group[k];
    const float p = st.master[k];
    const float m = st.exp_avg.get(i), v = st.exp_avg_sq.get(i);
    if (g < 0) {  // padding: untouched
      EXPECT_EQ(std::memcmp(&p, &master0[k], 4), 0) << "padding element " << i << " was written";
      EXPECT_EQ(st.exp_avg.bits(i), m0.bits(i));
      EXPECT_EQ(st.exp_avg_sq.bits(i), v0.bits(i));
      continue;
    }
    const OracleElem& o = orc[k];
    EXPECT_TRUE(std::isfinite(p) && std::isfinite(m) && !std::isnan(v)) << "element " << i;
    const double tp = steps * (2.0 * ulp32(std::max(std::fabs(o.p), std::fabs(static_cast<double>(p)))) + upd);
    const double tm = mv_rel * std::fabs(o.m) + m_abs;
    const double tv = mv_rel * o.v + 1e-30;
    const double ep = std::fabs(p - o.p) / tp, em = std::fabs(m - o.m) / tm;
    const double ev = std::isinf(o.v) && std::isinf(v) ? 0.0 : std::fabs(v - o.v) / tv;
    w.p = std::max(w.p, ep);
    w.m = std::max(w.m, em);
    w.v = std::max(w.v, ev);
    w.mean_abs_p += std::fabs(p - o.p);
    ++counted;
    if (ep > 1.0 || em > 1.0 || ev > 1.0) {
      ADD_FAILURE() << describe(cfg) << ": element " << i << " p=" << p << " oracle " << o.p << " (tol " << tp
                    << "), m=" << m << " oracle " << o.m << ", v=" << v << " oracle " << o.v;
      break;
    }
    // The param output is the new master rounded to the param dtype, written in the same pass.
    if (cfg.write_params) {
      const std::int64_t bi = prob.buffer_index[k];
      EXPECT_EQ(st.params.bits(bi), num::encode(cfg.param_dtype, p)) << describe(cfg) << " element " << i;
    }
  }
  if (counted > 0) w.mean_abs_p /= static_cast<double>(counted);
  // Param buffer elements outside this rank's shard are never written.
  if (cfg.write_params) {
    std::vector<bool> mine(static_cast<std::size_t>(prob.buffer_numel), false);
    for (auto bi : prob.buffer_index)
      if (bi >= 0) mine[static_cast<std::size_t>(bi)] = true;
    for (std::int64_t b = 0; b < prob.buffer_numel; ++b)
      if (!mine[static_cast<std::size_t>(b)]) {
        EXPECT_EQ(st.params.bits(b), 0u) << "param " << b << " not ours";
      }
  }
  return w;
}

TEST(ShardChunks, CoverTheShardInOrderWithinMaxChunk) {
  const Problem prob = default_problem();
  const Layout& L = prob.layout;
  for (int rank = 0; rank < L.world_size(); ++rank) {
    for (std::int64_t max_chunk : {std::int64_t{1}, std::int64_t{7}, std::int64_t{97}, std::int64_t{1} << 16}) {
      const auto chunks = shard_chunks(L, 0, rank, max_chunk);
      const auto segs = L.segments(0, rank);
      std::int64_t seg_total = 0;
      for (const auto& s : segs) seg_total += s.length;
      std::int64_t total = 0, prev_end = -1;
      std::size_t si = 0;
      std::int64_t in_seg = 0;
      for (const auto& c : chunks) {
        ASSERT_GT(c.length, 0);
        ASSERT_LE(c.length, max_chunk);
        ASSERT_GE(c.shard_offset, prev_end) << "chunks in shard order";
        prev_end = c.shard_offset + c.length;
        ASSERT_LT(si, segs.size());
        const Segment& s = segs[si];
        const ParamPlacement& pl = L.params()[static_cast<std::size_t>(s.param)];
        EXPECT_EQ(c.shard_offset, s.shard_offset + in_seg);
        EXPECT_EQ(c.buffer_offset, pl.offset + s.param_offset + in_seg);
        EXPECT_EQ(c.group, s.group);
        // The buffer range lies in this rank's slice of the param's bucket.
        const Range own = L.shard_range(pl.bucket, rank);
        EXPECT_GE(c.buffer_offset, own.begin);
        EXPECT_LE(c.buffer_offset + c.length, own.end);
        in_seg += c.length;
        if (in_seg == s.length) {
          ++si;
          in_seg = 0;
        }
        total += c.length;
      }
      EXPECT_EQ(si, segs.size());
      EXPECT_EQ(total, seg_total) << "every param element of the shard, no padding";
    }
  }
  EXPECT_THROW(shard_chunks(L, 0, 0, 0), Error);
}

TEST(FusedAdam, MatchesDoubleOracleEveryVariant100Steps) {
  const Problem prob = default_problem(3);
  ASSERT_GT(prob.chunks.size(), 40u);
  ASSERT_TRUE(std::count(prob.group.begin(), prob.group.end(), 0) > 100 &&
              std::count(prob.group.begin(), prob.group.end(), 1) > 10)
      << "the shard must hold both weight-decay groups";
  for (const AdamConfig& cfg : all_variants()) {
    SCOPED_TRACE(describe(cfg));
    const Worst w = run_against_oracle(cfg, prob, 100);
    // Report how close to the bounds the variant came (all must be <= 1).
    std::printf("%-44s worst/tol p %.3f m %.3f v %.3f  mean|dp| %.2e\n", describe(cfg).c_str(), w.p, w.m, w.v,
                w.mean_abs_p);
  }
}

TEST(FusedAdam, LrZeroLeavesParamsBitwiseAndTinyLrIsFinite) {
  const Problem prob = default_problem();
  for (bool decoupled : {true, false}) {
    AdamConfig cfg;
    cfg.decoupled_weight_decay = decoupled;
    cfg.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 0.5}};
    State st(prob, cfg, 5);
    const std::vector<float> before = st.master;
    StepScalars sc;
    sc.lr = 0.0f;
    for (int s = 0; s < 5; ++s) {
      random_grads(st.grads, 900 + static_cast<std::uint64_t>(s), 1.0f);
      fused_adam_step(cfg, st.pointers(prob), &sc, Backend::Host, nullptr);
    }
    EXPECT_EQ(std::memcmp(before.data(), st.master.data(), before.size() * 4), 0) << "lr = 0 must not move params";
    for (std::int64_t i = 0; i < prob.shard_numel; ++i)
      ASSERT_FALSE(std::isnan(st.exp_avg.get(i)) || std::isnan(st.exp_avg_sq.get(i)));
    EXPECT_EQ(sc.step, 5);
    EXPECT_EQ(sc.group_step_size[0], 0.0f);
    EXPECT_EQ(sc.group_decay[0], 1.0f);
  }
  // lr = 1e-12 and lr = 0 against the oracle over 100 steps (every variant of grads).
  for (const AdamConfig& cfg : all_variants()) {
    if (cfg.moment_dtype != DType::f32 || !cfg.write_params || cfg.param_dtype != DType::bf16) continue;
    SCOPED_TRACE(describe(cfg));
    run_against_oracle(cfg, prob, 100, 1e-12f);
    run_against_oracle(cfg, prob, 100, 0.0f);
  }
}

TEST(FusedAdam, HugeAndTinyGradients) {
  const Problem prob = default_problem();
  for (const AdamConfig& base : all_variants()) {
    if (base.grad_dtype != DType::f32 || base.moment_dtype != DType::f32 || base.write_params) continue;
    SCOPED_TRACE(describe(base));
    // Huge raw grads unscaled by a tiny inv_loss_scale: ordinary steps.
    run_against_oracle(base, prob, 20, -1.0f, 1e30f, 1e-30f);
    // Tiny grads: v underflows toward 0, eps dominates; no NaN, oracle agrees.
    run_against_oracle(base, prob, 20, -1.0f, 1e-30f, 1.0f);
    // Huge effective grads (1e30): (1-b2) g^2 overflows fp32, so v = +Inf and the update
    // is m / Inf = 0, exactly as torch's fp32 AdamW; the oracle, which stores v as fp32
    // between steps, agrees; params stay finite (only the decay moves them).
    run_against_oracle(base, prob, 5, -1.0f, 1e30f, 1.0f);
  }
}

/// A copy of everything a skipped step must leave untouched.
struct Snapshot {
  std::vector<float> master;
  Array m, v, params;
  std::int64_t step;
  explicit Snapshot(const State& st, const StepScalars& sc)
      : master(st.master), m(st.exp_avg), v(st.exp_avg_sq), params(st.params), step(sc.step) {}
  void expect_same(const State& st, const StepScalars& sc) const {
    EXPECT_EQ(std::memcmp(master.data(), st.master.data(), master.size() * 4), 0) << "master changed";
    EXPECT_EQ(m.bytes, st.exp_avg.bytes) << "exp_avg changed";
    EXPECT_EQ(v.bytes, st.exp_avg_sq.bytes) << "exp_avg_sq changed";
    EXPECT_EQ(params.bytes, st.params.bytes) << "param output changed";
    EXPECT_EQ(step, sc.step) << "step count changed";
  }
};

TEST(FusedAdam, NonFiniteGradientSkipsTheWholeStep) {
  const Problem prob = default_problem();
  const std::int64_t first = prob.chunks.front().buffer_offset;
  const std::int64_t middle = prob.chunks[prob.chunks.size() / 2].buffer_offset + 3;
  const std::int64_t last = prob.chunks.back().buffer_offset + prob.chunks.back().length - 1;
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (DType gd : {DType::f32, DType::bf16, DType::f16}) {
    for (float bad : bad_values) {
      for (std::int64_t where : {first, middle, last}) {
        AdamConfig cfg;
        cfg.grad_dtype = gd;
        cfg.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 1.0}};
        State st(prob, cfg, 3);
        StepScalars sc;
        sc.lr = 1e-3f;
        auto one_step = [&](bool expect_skip) {
          sc.grad_sumsq = 0.0f;
          sc.nonfinite = 0.0f;
          sc.found_inf = 0;
          ShardPointers sp = st.pointers(prob);
          accumulate_grad_sumsq(gd, sp, &sc, Backend::Host, nullptr);
          finalize_grad_norm(1.0f, &sc, Backend::Host, nullptr);
          EXPECT_EQ(sc.found_inf != 0, expect_skip);
          fused_adam_step(cfg, sp, &sc, Backend::Host, nullptr);
        };
        random_grads(st.grads, 1, 1.0f);
        one_step(false);
        one_step(false);
        const Snapshot snap(st, sc);
        random_grads(st.grads, 2, 1.0f);
        st.grads.set(where, bad);
        one_step(true);
        snap.expect_same(st, sc);
        EXPECT_GT(sc.nonfinite, 0.0f);
        // The next good step proceeds from the untouched state.
        random_grads(st.grads, 3, 1.0f);
        one_step(false);
        EXPECT_EQ(sc.step, 3);
      }
    }
  }
}

TEST(FusedAdam, HostGraphReplayEqualsEagerSteps) {
  const Problem prob = default_problem();
  for (const AdamConfig& cfg : all_variants()) {
    if (cfg.grad_dtype == DType::f16 || cfg.param_dtype == DType::f16) continue;  // keep it quick
    SCOPED_TRACE(describe(cfg));
    State eager(prob, cfg, 11), graph(prob, cfg, 11);
    random_grads(eager.grads, 12, 1.0f);
    graph.grads = eager.grads;
    StepScalars sc_eager, sc_graph;
    float lr_slot = 0.0f;  // stands for the pinned host slot a captured copy reads
    HostStream stream;
    stream.begin_capture();
    copy_async(Backend::Host, &sc_graph.lr, &lr_slot, sizeof(float), stream.handle());
    fused_adam_step(cfg, graph.pointers(prob), &sc_graph, Backend::Host, stream.handle());
    const HostGraph g = stream.end_capture();
    EXPECT_EQ(sc_graph.step, 0) << "capture must not run the step";
    for (int s = 0; s < 50; ++s) {
      const float lr = schedule_lr(s);
      sc_eager.lr = lr;
      fused_adam_step(cfg, eager.pointers(prob), &sc_eager, Backend::Host, nullptr);
      lr_slot = lr;
      g.replay();
    }
    EXPECT_EQ(sc_graph.step, 50);
    EXPECT_EQ(std::memcmp(eager.master.data(), graph.master.data(), eager.master.size() * 4), 0);
    EXPECT_EQ(eager.exp_avg.bytes, graph.exp_avg.bytes);
    EXPECT_EQ(eager.exp_avg_sq.bytes, graph.exp_avg_sq.bytes);
    EXPECT_EQ(eager.params.bytes, graph.params.bytes);
  }
}

TEST(FusedAdam, ConstantLaunchesWhateverTheParamCount) {
  for (int scale : {1, 5}) {
    const Problem prob = make_problem(odd_specs(scale), 3, 1, 97, 100000 * scale);
    AdamConfig cfg;
    cfg.groups = {AdamGroup{}, AdamGroup{}};
    State st(prob, cfg, 1);
    StepScalars sc;
    HostStream stream;
    stream.begin_capture();
    fused_adam_step(cfg, st.pointers(prob), &sc, Backend::Host, stream.handle());
    accumulate_grad_sumsq(cfg.grad_dtype, st.pointers(prob), &sc, Backend::Host, stream.handle());
    finalize_grad_norm(1.0f, &sc, Backend::Host, stream.handle());
    EXPECT_EQ(stream.end_capture().size(), 4u) << "prologue + main pass + norm + finalize";
  }
}

TEST(FusedAdam, PrologueDerivesTheFactorsInDouble) {
  AdamConfig cfg;
  cfg.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.01, 0.25}, AdamGroup{0.0, 3.0}};
  StepScalars sc;
  sc.lr = 3e-4f;
  sc.step = 41;
  adam_step_prologue(cfg, &sc, Backend::Host, nullptr);
  EXPECT_EQ(sc.step, 42);
  const double bc1 = 1.0 - std::pow(0.9, 42.0), bc2 = 1.0 - std::pow(0.999, 42.0);
  // pow by repeated squaring vs libm pow: equal after rounding to float but for a rare
  // tie; allow one float ulp.
  auto near = [](float got, double want) { return std::fabs(got - want) <= 1.0001 * ulp32(want); };
  EXPECT_TRUE(near(sc.step_size, 3e-4f / bc1));
  EXPECT_TRUE(near(sc.bc2_sqrt, std::sqrt(bc2)));
  for (int g = 0; g < 3; ++g) {
    const double lr_g = static_cast<double>(3e-4f) * cfg.groups[static_cast<std::size_t>(g)].lr_scale;
    EXPECT_TRUE(near(sc.group_step_size[g], lr_g / bc1)) << g;
    EXPECT_EQ(sc.group_decay[g], static_cast<float>(1.0 - lr_g * cfg.groups[static_cast<std::size_t>(g)].weight_decay));
  }
  // found_inf: nothing is derived, the step is not counted.
  StepScalars skip = sc;
  skip.found_inf = 1;
  skip.lr = 1.0f;
  adam_step_prologue(cfg, &skip, Backend::Host, nullptr);
  EXPECT_EQ(std::memcmp(&skip.step_size, &sc.step_size, sizeof(float) * 2), 0);
  EXPECT_EQ(skip.step, 42);
}

TEST(FusedAdam, TwoBuffersShareOneStepCounter) {
  // adam_step_prologue once + adam_step_apply per buffer == fused_adam_step per buffer
  // with separate counters.
  const Problem a = default_problem(), b = skewed_problem(2);
  AdamConfig cfg;
  cfg.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 1.0}};
  State sa(a, cfg, 1), sb(b, cfg, 2), ra(a, cfg, 1), rb(b, cfg, 2);
  random_grads(sa.grads, 5, 1.0f);
  random_grads(sb.grads, 6, 1.0f);
  ra.grads = sa.grads;
  rb.grads = sb.grads;
  StepScalars shared, ca, cb;
  for (int s = 0; s < 3; ++s) {
    shared.lr = ca.lr = cb.lr = schedule_lr(s);
    adam_step_prologue(cfg, &shared, Backend::Host, nullptr);
    adam_step_apply(cfg, sa.pointers(a), &shared, Backend::Host, nullptr);
    adam_step_apply(cfg, sb.pointers(b), &shared, Backend::Host, nullptr);
    fused_adam_step(cfg, ra.pointers(a), &ca, Backend::Host, nullptr);
    fused_adam_step(cfg, rb.pointers(b), &cb, Backend::Host, nullptr);
  }
  EXPECT_EQ(shared.step, 3);
  EXPECT_EQ(sa.params.bytes, ra.params.bytes);
  EXPECT_EQ(sb.params.bytes, rb.params.bytes);
  EXPECT_EQ(sb.exp_avg_sq.bytes, rb.exp_avg_sq.bytes);
}

TEST(FusedAdam, RejectsBadConfigurationsBeforeEnqueueing) {
  const Problem prob = default_problem();
  AdamConfig good;
  good.groups = {AdamGroup{}, AdamGroup{}};
  State st(prob, good, 1);
  StepScalars sc;
  int line = 0;
  auto expect_invalid = [&](AdamConfig c, ShardPointers sp) {
    ++line;
    try {
      fused_adam_step(c, sp, &sc, Backend::Host, nullptr);
      ADD_FAILURE() << "case " << line << ": expected Error(InvalidArgument)";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    }
    EXPECT_EQ(sc.step, 0) << "a refused call must not count a step";
  };
  AdamConfig c = good;
  c.groups.clear();
  expect_invalid(c, st.pointers(prob));
  c.groups.assign(kMaxAdamGroups + 1, AdamGroup{});
  expect_invalid(c, st.pointers(prob));
  c = good;
  c.moment_dtype = DType::f16;
  expect_invalid(c, st.pointers(prob));
  c = good;
  c.grad_dtype = DType::e4m3;
  expect_invalid(c, st.pointers(prob));
  c = good;
  c.beta2 = 1.0;
  expect_invalid(c, st.pointers(prob));
  ShardPointers sp = st.pointers(prob);
  sp.params = nullptr;
  expect_invalid(good, sp);
  sp = st.pointers(prob);
  sp.exp_avg = nullptr;
  expect_invalid(good, sp);
  c = good;
  c.groups.resize(1);
  std::vector<ShardChunk> chunks = prob.chunks;
  chunks.back().group = 1;  // a table entry beyond the config's groups
  sp = st.pointers(prob);
  sp.chunks = chunks.data();
  expect_invalid(c, sp);
  chunks.back().group = 0;
  chunks.back().length += 1000;  // past the end of the shard
  expect_invalid(good, sp);
  chunks.back().length -= 1000;
  chunks.back().moment_shift = chunks.back().shard_offset + 1;  // moments before the arrays' start
  expect_invalid(good, sp);
  chunks.back().moment_shift = -1;
  expect_invalid(good, sp);
  chunks.back().moment_shift = 0;
  sp.moment_numel = chunks.back().shard_offset + chunks.back().length - 1;  // moments past their end
  expect_invalid(good, sp);
  sp.moment_numel += 1;  // exactly long enough: accepted
  fused_adam_step(good, sp, &sc, Backend::Host, nullptr);
  EXPECT_EQ(sc.step, 1);
  EXPECT_THROW(fused_adam_step(good, st.pointers(prob), nullptr, Backend::Host, nullptr), Error);
}

}  // namespace
