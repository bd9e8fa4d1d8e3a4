// Muon's pure host parts (issue 34, docs/muon.md): the home assignment at 1-8 ranks, the
// lr adjustment formulas, the Newton-Schulz host twin against a double oracle, which
// parameters a Muon group accepts, the exchange plan and the exchange's dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/muon_oracle.hpp"
#include "kernels/muon/muon.hpp"
#include "optimizer/muon_pass.hpp"
#include "optimizer/muon_plan.hpp"
#include "shardopt/error.hpp"
#include "shardopt/layout.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::detail;

// A hand-worked case: costs 4, 3, 3, 2, 2, 2 on 3 ranks. Largest first: 4 -> r0; the two
// 3s -> r1, r2 (loads 4 3 3); 2 -> r1 (the first least-loaded: 4 5 3); 2 -> r2 (4 5 5);
// 2 -> r0 (6 5 5).
TEST(MuonHomes, HandWorkedThreeRanks) {
  EXPECT_EQ(assign_muon_homes({4, 3, 3, 2, 2, 2}, 3), (std::vector<int>{0, 1, 2, 1, 2, 0}));
  // Order of the input does not matter beyond ties: the largest goes to rank 0 wherever it is.
  EXPECT_EQ(assign_muon_homes({2, 2, 9}, 2), (std::vector<int>{1, 1, 0}));
}

// At 1-8 ranks, over the matrices of a Llama-like block and 8 equal experts: every home is
// a rank; as many ranks as matrices gives each matrix its own rank; the largest matrix
// lives on rank 0; the greedy bound holds (the busiest rank exceeds the idlest by at most
// the largest cost); equal costs go to the ranks in order; the result is the same on every
// call (every rank computes the same).
TEST(MuonHomes, LargestFirstToTheLeastLoadedAtOneToEightRanks) {
  std::vector<double> costs;
  for (auto [r, c] : std::vector<std::pair<int, int>>{{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048},
                                                      {5632, 2048}, {5632, 2048}, {2048, 5632}})
    costs.push_back(newton_schulz_cost(r, c, 5));
  for (int e = 0; e < 8; ++e) costs.push_back(newton_schulz_cost(1408, 2048, 5));
  for (int world = 1; world <= 8; ++world) {
    SCOPED_TRACE(world);
    const std::vector<int> homes = assign_muon_homes(costs, world);
    EXPECT_EQ(homes, assign_muon_homes(costs, world));
    ASSERT_EQ(homes.size(), costs.size());
    std::vector<double> load(static_cast<std::size_t>(world), 0.0);
    for (std::size_t k = 0; k < costs.size(); ++k) {
      ASSERT_GE(homes[k], 0);
      ASSERT_LT(homes[k], world);
      load[static_cast<std::size_t>(homes[k])] += costs[k];
    }
    const double largest = *std::max_element(costs.begin(), costs.end());
    EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), largest);
    const auto biggest = std::max_element(costs.begin(), costs.end()) - costs.begin();
    EXPECT_EQ(homes[static_cast<std::size_t>(biggest)], 0);
    if (world == 1) {
      EXPECT_TRUE(std::all_of(homes.begin(), homes.end(), [](int h) { return h == 0; }));
    }
  }
  // Equal costs, more ranks than matrices: one each, in order.
  EXPECT_EQ(assign_muon_homes({5, 5, 5}, 8), (std::vector<int>{0, 1, 2}));
  // NS cost: ns_steps * (2 n^2 k + n^3), n = min, k = max; the same for a matrix and its transpose.
  EXPECT_EQ(newton_schulz_cost(8, 13, 5), 5.0 * (2 * 64 * 13 + 512));
  EXPECT_EQ(newton_schulz_cost(13, 8, 5), newton_schulz_cost(8, 13, 5));
}

// torch.optim.Muon's adjust_lr_fn: "original" sqrt(max(1, A/B)), "match_rms_adamw" 0.2 sqrt(max(A, B)).
TEST(MuonSettings, LrAdjustmentFormulasAndDefaults) {
  EXPECT_DOUBLE_EQ(muon_lr_ratio(MuonLrAdjust::Original, 24, 16), std::sqrt(1.5));
  EXPECT_DOUBLE_EQ(muon_lr_ratio(MuonLrAdjust::Original, 16, 24), 1.0);
  EXPECT_DOUBLE_EQ(muon_lr_ratio(MuonLrAdjust::MatchRmsAdamW, 16, 24), 0.2 * std::sqrt(24.0));
  EXPECT_DOUBLE_EQ(muon_lr_ratio(MuonLrAdjust::MatchRmsAdamW, 4096, 1024), 0.2 * 64.0);
  const MuonSettings s;
  EXPECT_EQ(s.momentum, 0.95);
  EXPECT_TRUE(s.nesterov);
  EXPECT_EQ(s.ns_steps, 5);
  EXPECT_EQ(s.ns_coefficients, (std::array<double, 3>{3.4445, -4.7750, 2.0315}));
  EXPECT_EQ(s.eps, 1e-7);
  EXPECT_EQ(s.adjust_lr, MuonLrAdjust::Original);
  EXPECT_EQ(AdamGroup{}.algorithm, GroupAlgorithm::AdamW);  // the existing API is unchanged
  EXPECT_STREQ(to_string(MuonLrAdjust::MatchRmsAdamW), "match_rms_adamw");
  EXPECT_STREQ(to_string(GroupAlgorithm::Muon), "muon");
}

// One matrix's update on the host (zero momentum, so u = (1 - mu)(1 + mu) g with Nesterov)
// against the double oracle, wide and tall, within the derived bound on the update.
TEST(MuonHostTwin, OneMatrixMatchesTheDoubleOracle) {
  for (auto [rows, cols] : std::vector<std::pair<int, int>>{{8, 13}, {24, 16}, {1, 7}, {32, 32}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
    std::vector<float> g(static_cast<std::size_t>(n)), m(static_cast<std::size_t>(n), 0.0f);
    for (std::int64_t j = 0; j < n; ++j) g[static_cast<std::size_t>(j)] = shardopt::test::muon::value(0, rows, j);
    std::vector<double> u(g.begin(), g.end());
    kernels::MuonMatrix mat{g.data(), m.data(), rows, cols, MuonSettings{}};
    std::vector<float> work(static_cast<std::size_t>(kernels::muon_workspace(rows, cols)));
    kernels::muon_matrix_host(mat, work.data());
    // The oracle: momentum from zero, Nesterov, normalization, iteration.
    const double mu = 0.95;
    double sumsq = 0.0;
    for (double& x : u) {
      const double mm = (1 - mu) * x;
      x = (1 - mu) * x + mu * mm;
      sumsq += x * x;
    }
    for (double& x : u) x /= std::sqrt(sumsq);
    const double bound = shardopt::test::muon::update_error_bound(u, rows, cols, MuonSettings{}, 0);
    u = shardopt::test::muon::ns_double(u, rows, cols, MuonSettings{});
    EXPECT_LT(bound, 0.02 * shardopt::test::muon::frob(u)) << "a vacuous bound";
    double err = 0.0;
    for (std::size_t j = 0; j < u.size(); ++j) err = std::max(err, std::fabs(g[j] - u[j]));
    EXPECT_LE(err, bound);
    for (std::size_t j = 0; j < u.size(); ++j)
      EXPECT_FLOAT_EQ(m[j], static_cast<float>(0.05 * shardopt::test::muon::value(0, rows, static_cast<std::int64_t>(j))));
  }
}

// What a Muon group accepts: 2-D parameters and grouped parameters of 2-D members, each
// member a matrix of its own; the error names anything else.
TEST(MuonPlan, MatricesOfAGroupAndTheErrorNamingTheParameter) {
  AdamGroup muon;
  muon.algorithm = GroupAlgorithm::Muon;
  const std::vector<ParamSpec> specs = {ParamSpec::tensor("w", {6, 4}, DType::bf16, "m"),
                                        ParamSpec::tensor("b", {6}, DType::bf16, "a"),
                                        ParamSpec::grouped("e", 3, {5, 2}, DType::bf16, "m")};
  Layout L(specs, 2, LayoutOptions{});
  std::vector<AdamGroup> groups(L.groups().size());
  groups[static_cast<std::size_t>(L.group_index("m"))] = muon;
  const auto mats = muon_matrices(L, groups);
  ASSERT_EQ(mats.size(), 4u);
  EXPECT_EQ(mats[0].param, 0);
  EXPECT_EQ(mats[0].rows, 6);
  EXPECT_EQ(mats[0].cols, 4);
  for (int m = 0; m < 3; ++m) {
    EXPECT_EQ(mats[static_cast<std::size_t>(1 + m)].member, m);
    EXPECT_EQ(mats[static_cast<std::size_t>(1 + m)].offset, 10 * m);
  }
  // The exchange plan: every matrix element is sent exactly once, by its owner, to its
  // home (received there in the same slot position), or kept by its owner when that is its
  // home (a local piece: no slot).
  std::vector<int> seen(static_cast<std::size_t>(24 + 30), 0);
  std::int64_t slot_total = 0;
  for (int r = 0; r < 2; ++r) {
    const MuonExchangePlan plan = muon_exchange_plan(L, r, mats);
    for (const MuonRun& run : plan.sends) {
      const auto& mi = mats[static_cast<std::size_t>(run.matrix)];
      EXPECT_EQ(run.peer, mi.home);
      EXPECT_NE(run.peer, r);
      EXPECT_LE(run.slot_pos + run.length, plan.slot);
      slot_total += run.length;
      const std::int64_t base = mi.param == 0 ? 0 : 24 + mi.offset;
      for (std::int64_t j = 0; j < run.length; ++j) ++seen[static_cast<std::size_t>(base + run.offset + j)];
    }
    for (const MuonRun& run : plan.locals) {
      const auto& mi = mats[static_cast<std::size_t>(run.matrix)];
      EXPECT_EQ(mi.home, r);
      EXPECT_EQ(run.peer, r);
      const std::int64_t base = mi.param == 0 ? 0 : 24 + mi.offset;
      for (std::int64_t j = 0; j < run.length; ++j) ++seen[static_cast<std::size_t>(base + run.offset + j)];
    }
    std::int64_t received = 0;
    for (const MuonRun& run : plan.receives) {
      EXPECT_EQ(mats[static_cast<std::size_t>(run.matrix)].home, r);
      EXPECT_NE(run.peer, r);
      received += run.length;
    }
    EXPECT_LE(received, plan.slot * 2);
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; }));
  EXPECT_GT(slot_total, 0);
  // A world of one keeps every piece at home: no slot, nothing exchanged.
  const Layout one(specs, 1, LayoutOptions{});
  const auto mats1 = muon_matrices(one, groups);
  const MuonExchangePlan plan1 = muon_exchange_plan(one, 0, mats1);
  EXPECT_EQ(plan1.slot, 0);
  EXPECT_TRUE(plan1.sends.empty());
  EXPECT_TRUE(plan1.receives.empty());
  EXPECT_EQ(plan1.locals.size(), mats1.size());
  groups[static_cast<std::size_t>(L.group_index("a"))] = muon;  // now "b" (1-D) is in a Muon group
  try {
    (void)muon_matrices(L, groups);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  groups[static_cast<std::size_t>(L.group_index("a"))] = AdamGroup{};
  groups[static_cast<std::size_t>(L.group_index("m"))].muon.momentum = 1.0;
  EXPECT_THROW((void)muon_matrices(L, groups), Error);
}

// The two all-to-alls carry what they must and no more (issue 48): the gradients raw, in
// the gradient dtype; the updates as bf16 on CUDA when every Muon group runs bf16 GEMMs
// (their result is a bf16 value), else as fp32 (the host twin's Newton-Schulz is fp32).
// Rank 0 of 2 with matrices homed on both ranks, so there is an exchange.
TEST(MuonPlan, TheExchangeTravelsInTheNarrowestExactDtype) {
  AdamGroup muon;
  muon.algorithm = GroupAlgorithm::Muon;
  const std::vector<ParamSpec> specs = {ParamSpec::tensor("w", {64, 32}, DType::bf16, "m"),
                                        ParamSpec::tensor("v", {96, 64}, DType::bf16, "n")};
  const Layout L(specs, 2, LayoutOptions{});
  std::vector<float> storage(16384);
  const std::vector<MuonPieceStorage> pieces(specs.size(), MuonPieceStorage{storage.data(), storage.data(), nullptr,
                                                                            DType::bf16, 0});
  for (const DType grads : {DType::bf16, DType::f32}) {
    for (const MuonGemm second : {MuonGemm::Bf16, MuonGemm::F32}) {
      SCOPED_TRACE(std::string(to_string(grads)) + " gradients, second group " + to_string(second));
      std::vector<AdamGroup> groups(L.groups().size(), muon);
      groups[static_cast<std::size_t>(L.group_index("n"))].muon.gemm = second;
      MuonPass pass(Backend::Host, L, 0, groups);
      pass.bind(pieces, grads);
      EXPECT_GT(pass.exchange_slot(), 0);
      EXPECT_EQ(pass.gradient_exchange_dtype(), grads);
      EXPECT_EQ(pass.update_exchange_dtype(), DType::f32);
      EXPECT_EQ(muon_update_exchange_dtype(Backend::Cuda, groups, pass.matrices()),
                second == MuonGemm::Bf16 ? DType::bf16 : DType::f32);
    }
  }
}

// MuonUpdate::profile times the CUDA update's stages; the host backend has none and says so.
TEST(MuonHostTwin, ProfileIsRefusedOnTheHostBackend) {
  std::vector<float> g(24, 0.5f), m(24, 0.0f);
  const kernels::MuonUpdate update(Backend::Host, {{g.data(), m.data(), 4, 6, MuonSettings{}}});
  const StepScalars sc;
  try {
    (void)update.profile(&sc, nullptr, 3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported);
    EXPECT_NE(std::string(e.what()).find("host backend"), std::string::npos) << e.what();
  }
}

}  // namespace
