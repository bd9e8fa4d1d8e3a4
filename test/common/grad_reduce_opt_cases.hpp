// grad_reduce_opt_cases.hpp - GradReducePrecision::F32Accumulate in the optimizers, written
// once for both backends (host: test/mpi/test_grad_reduce_opt.cpp; CUDA + NCCL:
// test/gpu/test_grad_reduce_opt_gpu.cpp): DistributedAdam's reduced gradient (rounded once
// to bf16), Fsdp's and HSDP's (fp32 in the gradient shard), and graph replay against eager
// steps. Oracles: the rank-order fp32 loop and the exact mean (common/known_grads.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/fsdp_cases.hpp"
#include "common/known_grads.hpp"

namespace shardopt::test {

/// Sum over this rank's pieces of |result - exact mean|; elements whose bits differ from
/// the oracle; elements farther than one rounding from the exact mean.
struct OptReduceCheck {
  double total_error = 0;
  int not_oracle = 0;
  int beyond_one_rounding = 0;
  int checked = 0;
};

/// Checks the shard_grad pieces (`read(i)`: this rank's piece of param i, values and its
/// param offset) against `oracle(i, j)` (the promised value) and `exact(i, j)`.
template <class Read, class Oracle, class Exact>
OptReduceCheck check_pieces(int num_params, DType t, const Read& read, const Oracle& oracle, const Exact& exact) {
  OptReduceCheck c;
  const double u = t == DType::f32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
  for (int i = 0; i < num_params; ++i) {
    std::int64_t offset = 0;
    const std::vector<float> got = read(i, offset);
    for (std::size_t k = 0; k < got.size(); ++k) {
      const std::int64_t j = offset + static_cast<std::int64_t>(k);
      const float want = oracle(i, j);
      const double e = exact(i, j);
      c.not_oracle += num::f32_bits(want) != num::f32_bits(got[k]);
      c.beyond_one_rounding += !within_one_rounding(got[k], e, u);
      c.total_error += std::fabs(got[k] - e);
      ++c.checked;
    }
  }
  return c;
}

// ------------------------------------------------------------------ DistributedAdam

/// One step of DistributedAdam (bf16 grads, Average) over known gradients; returns the
/// check of this rank's reduced gradient pieces (shard_grad, bf16) against the
/// rank-order oracle rounded once to bf16.
inline OptReduceCheck dist_adam_reduce_known(Backend b, GradReducePrecision p) {
  Communicator comm = make_comm(b);
  const int n = comm.size(), me = comm.rank();
  DistributedAdamOptions o = base_options(DType::bf16);
  o.grad_reduce_precision = p;
  DistributedAdam opt(comm, small_model(), o);
  TestStream s(b);
  init_params(opt, s.get());
  for (int i = 0; i < opt.num_params(); ++i) {
    const GradView g = opt.grad(i);
    std::vector<std::uint16_t> codes(static_cast<std::size_t>(g.numel()));
    for (std::size_t j = 0; j < codes.size(); ++j) codes[j] = num::f32_to_bf16(known_grad(me, i, static_cast<std::int64_t>(j)));
    from_host(b, g.data, codes);
  }
  report_all(opt, s.get());
  opt.step(s.get());
  s.sync();
  auto read = [&](int i, std::int64_t& offset) {
    const ShardView v = opt.shard_grad(i, DType::bf16, s.get());
    s.sync();
    offset = v.param_offset;
    return read_f32(b, v);
  };
  // Per element: one reused buffer (an allocation per element is what the sanitized run,
  // whose malloc unwinds the whole stack, pays most for).
  std::vector<float> x;
  auto values = [n, &x](int i, std::int64_t j) -> const std::vector<float>& {
    x.clear();
    for (int r = 0; r < n; ++r) x.push_back(known_grad(r, i, j));
    return x;
  };
  auto oracle = [&](int i, std::int64_t j) { return num::bf16_to_f32(num::f32_to_bf16(rank_order_sum(values(i, j), true))); };
  auto exact = [&](int i, std::int64_t j) {
    double sum = 0;
    for (float v : values(i, j)) sum += v;
    return sum / n;
  };
  return check_pieces(opt.num_params(), DType::bf16, read, oracle, exact);
}

/// F32Accumulate's reduced gradient is the oracle's bits and within one bf16 rounding of
/// the exact mean; from 3 ranks on Native is worse on the same data.
inline void case_dist_adam_f32_accumulate(Backend b) {
  const OptReduceCheck f = dist_adam_reduce_known(b, GradReducePrecision::F32Accumulate);
  EXPECT_GT(f.checked, 0);
  EXPECT_EQ(f.not_oracle, 0);
  EXPECT_EQ(f.beyond_one_rounding, 0);
  const OptReduceCheck g = dist_adam_reduce_known(b, GradReducePrecision::Native);
  if (world_size() >= 3) {
    EXPECT_GT(g.total_error, f.total_error) << "Native bf16 not worse than F32Accumulate";
  }
}

/// The captured step (overlapped per-bucket reduces, clipping, Adam, gathers) replays
/// with the bits of eager steps, with two microbatches.
inline void case_dist_adam_f32_accumulate_graph(Backend b, int iterations) {
  case_graph_equals_eager(b, DType::bf16, 2, iterations, false, {}, [](DistributedAdamOptions& o) {
    o.grad_reduce_precision = GradReducePrecision::F32Accumulate;
  });
}

// ------------------------------------------------------------------ Fsdp and HSDP

/// One iteration of Fsdp (bf16 slot, f32 gradient shard, Average; `shard_group` ranks per
/// shard group, 0 = all) over known gradients; returns the check of this rank's gradient
/// shard against the oracle: the fp32 sum over the shard group in shard-rank order / S,
/// then over the replicas in replica order / R, added to the zero shard.
inline OptReduceCheck fsdp_reduce_known(Backend b, int shard_group, GradReducePrecision p) {
  Communicator comm = make_comm(b);
  const int world = comm.size(), me = comm.rank();
  FsdpOptions o = fsdp_options(base_options(DType::f32));
  o.shard_group_size = shard_group;
  o.grad_reduce_precision = p;
  const int S = shard_group == 0 ? world : shard_group;
  const int R = world / S;
  Fsdp f(comm, fsdp_model(), small_units(), o);
  TestStream s(b);
  init_fsdp(f, s.get());
  const int nu = f.num_units();
  for (int u = 0; u < nu; ++u) (void)f.wait_param(u, s.get());
  for (int u = nu - 1; u >= 0; --u) {
    (void)f.wait_param(u, s.get());
    const auto grads = f.grad_slot(u, s.get());
    const FsdpUnit unit = small_units()[static_cast<std::size_t>(u)];
    for (int k = 0; k < unit.count; ++k) {
      const GradView& g = grads[static_cast<std::size_t>(k)];
      std::vector<std::uint16_t> codes(static_cast<std::size_t>(g.numel()));
      for (std::size_t j = 0; j < codes.size(); ++j)
        codes[j] = num::f32_to_bf16(known_grad(me, unit.first + k, static_cast<std::int64_t>(j)));
      from_host(b, g.data, codes);
    }
    f.grad_ready(u, s.get());
  }
  f.step(s.get());
  s.sync();
  auto read = [&](int i, std::int64_t& offset) {
    const ShardView v = f.shard_grad(i, DType::f32, s.get());
    s.sync();
    offset = v.param_offset;
    return read_f32(b, v);
  };
  std::vector<float> replicas, x;  // reused per element (see above)
  auto oracle = [&](int i, std::int64_t j) {
    replicas.clear();
    for (int q = 0; q < R; ++q) {
      x.clear();
      for (int r = 0; r < S; ++r) x.push_back(known_grad(q * S + r, i, j));
      replicas.push_back(rank_order_sum(x, true));
    }
    const float mean = R == 1 ? replicas.front() : rank_order_sum(replicas, true);
    return 0.0f + mean;  // added to the zeroed shard (-0 becomes +0)
  };
  auto exact = [&](int i, std::int64_t j) {
    double sum = 0;
    for (int r = 0; r < world; ++r) sum += known_grad(r, i, j);
    return sum / world;
  };
  return check_pieces(f.num_params(), DType::f32, read, oracle, exact);
}

/// Fsdp / HSDP with F32Accumulate: the gradient shard holds the oracle's bits, within one
/// fp32 rounding of the exact mean (bf16 data, power-of-two or single-hop groups); Native
/// (a bf16 reduce-scatter) is worse on the same data.
inline void case_fsdp_f32_accumulate(Backend b, int shard_group) {
  const OptReduceCheck f = fsdp_reduce_known(b, shard_group, GradReducePrecision::F32Accumulate);
  EXPECT_GT(f.checked, 0);
  EXPECT_EQ(f.not_oracle, 0);
  EXPECT_EQ(f.beyond_one_rounding, 0);
  const OptReduceCheck g = fsdp_reduce_known(b, shard_group, GradReducePrecision::Native);
  EXPECT_GT(g.total_error, f.total_error) << "Native bf16 not worse than F32Accumulate";
  EXPECT_GT(g.beyond_one_rounding, 0) << "Native bf16 within one fp32 rounding everywhere";
}

/// The whole Fsdp (or HSDP) iteration with F32Accumulate captured in one graph replays
/// with the bits of eager iterations.
inline void case_fsdp_f32_accumulate_graph(Backend b, int shard_group, int iterations) {
  FsdpCaseModel m{fsdp_model(), small_units(), base_options(DType::f32),
                  [shard_group](const DistributedAdamOptions& d) {
                    FsdpOptions o = fsdp_options(d);
                    o.shard_group_size = shard_group;
                    o.grad_reduce_precision = GradReducePrecision::F32Accumulate;
                    return o;
                  },
                  init_fsdp, [](Fsdp& f, Stream s, int rank) { fsdp_microbatch(f, s, rank, GradKind::Random); }};
  fsdp_graph_vs_eager(b, m, 2, iterations);
}

/// HSDP's shard group size for the graph case: 2 when there are at least 2 groups of 2,
/// else 1 (every rank a replica of its own).
inline int hsdp_group() { return world_size() >= 4 && world_size() % 2 == 0 ? 2 : 1; }

/// Every HSDP shape of this world: each shard group size S that divides it with at least
/// two replicas (S = 1: the shard hop is one rank's piece and the replica hop does all the
/// adding, e.g. 3 replicas of 1 at 3 ranks; at 8 ranks 8 x 1, 4 x 2 and 2 x 4).
inline std::vector<int> hsdp_groups() {
  std::vector<int> groups;
  for (int s = 1; s < world_size(); ++s)
    if (world_size() % s == 0) groups.push_back(s);
  return groups;
}

#define SHARDOPT_GRAD_REDUCE_OPT_CASES(Suite, backend)                                                      \
  TEST(Suite, DistributedAdamIsTheOracle) { case_dist_adam_f32_accumulate(backend); }                       \
  TEST(Suite, DistributedAdamGraphEqualsEager) { case_dist_adam_f32_accumulate_graph(backend, 3); }          \
  TEST(Suite, FsdpIsTheOracleAndBeatsNative) { case_fsdp_f32_accumulate(backend, 0); }                       \
  TEST(Suite, FsdpGraphEqualsEager) { case_fsdp_f32_accumulate_graph(backend, 0, 3); }                       \
  TEST(Suite, HsdpIsTheOracleAndBeatsNative) {                                                                \
    if (hsdp_groups().empty()) GTEST_SKIP() << "HSDP needs at least 2 ranks";                                 \
    for (const int s : hsdp_groups()) {                                                                       \
      SCOPED_TRACE("HSDP: " + std::to_string(world_size() / s) + " replicas of " + std::to_string(s));       \
      case_fsdp_f32_accumulate(backend, s);                                                                   \
    }                                                                                                         \
  }                                                                                                           \
  TEST(Suite, HsdpGraphEqualsEager) {                                                                         \
    if (world_size() < 2) GTEST_SKIP() << "HSDP needs at least 2 ranks";                                      \
    case_fsdp_f32_accumulate_graph(backend, hsdp_group(), 3);                                                 \
  }

}  // namespace shardopt::test
