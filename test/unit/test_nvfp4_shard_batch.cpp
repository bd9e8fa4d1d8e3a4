// Nvfp4ShardBatch on the host backend: a rank's sharded quantization of many tensors in
// two calls equals one nvfp4_partial_amax / quantize_nvfp4_shard call per tensor
// bitwise (poisoned buffers: nothing else written), and the assembled tensors equal the
// oracle, for batches of mixed shapes and ranges over world sizes 1-8 (empty ranges,
// odd and mid-block boundaries); a batch captured on a HostStream and replayed equals
// the eager calls; errors name the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_shard_batch_common.hpp"

namespace {
using namespace shardopt;
using namespace nvfp4_test;
namespace ref = nvfp4_ref;

constexpr Backend kHost = Backend::Host;

const std::vector<Nvfp4Shape> kShapes = {{37, 45}, {16, 16}, {1, 301}, {301, 1}, {17, 33}, {64, 48}, {3, 5}, {1, 1}};

// The cases of kShapes for `world` ranks: tensor t's bounds even (shifted by t, so that
// boundaries fall at odd and mid-block offsets) or random (empty ranges likely).
std::vector<ShardCase> cases_for(int world, std::mt19937& rng, std::uint32_t seed) {
  std::vector<ShardCase> cases;
  for (std::size_t t = 0; t < kShapes.size(); ++t) {
    const Nvfp4Shape& s = kShapes[t];
    ShardCase c{s, mxfp8_test::random_master(s.numel(), s.cols, seed + static_cast<std::uint32_t>(t), 0.02, false),
                {}};
    const auto shift = static_cast<std::int64_t>(t) * 7 - 17;
    c.bounds = t % 2 == 0 ? mxfp8_test::even_bounds(s.numel(), world, shift)
                          : mxfp8_test::random_bounds(s.numel(), world, rng);
    cases.push_back(std::move(c));
  }
  return cases;
}

// The batch protocol against the per-tensor calls and the oracle; false after a failure.
bool check_batch(const std::vector<ShardCase>& cases) {
  std::string problems;
  const std::vector<ref::Quantized> got = simulate_batch(kHost, cases, &problems);
  for (std::size_t t = 0; t < cases.size(); ++t) {
    const ref::Quantized want = reference(cases[t].shape, mxfp8_test::to_bf16(cases[t].master));
    if (!(got[t] == want)) problems += "tensor " + std::to_string(t) + " differs from the oracle; ";
  }
  std::string bounds;
  for (const ShardCase& c : cases) bounds += bounds_str(c.bounds) + " ";
  EXPECT_TRUE(problems.empty()) << "bounds " << bounds << ": " << problems;
  return problems.empty();
}

TEST(Nvfp4ShardBatch, EqualsPerTensorCallsAndOracleForWorldSizes1To8) {
  std::mt19937 rng(11);
  std::uint32_t seed = 100;
  for (int world = 1; world <= 8; ++world)
    for (int rep = 0; rep < 3; ++rep, seed += 16)
      if (!check_batch(cases_for(world, rng, seed))) return;
}

TEST(Nvfp4ShardBatch, EmptyRangesAndANonFiniteTensor) {
  // Rank 1 owns nothing of tensor 0 and all of tensor 1; tensor 2 holds an Inf on
  // rank 0 (refused on every rank), its boundary mid-byte.
  std::vector<ShardCase> cases;
  const Nvfp4Shape a{20, 19}, b{3, 7}, c{33, 17};
  cases.push_back({a, mxfp8_test::random_master(a.numel(), a.cols, 1, 0.0, false), {0, a.numel(), a.numel()}});
  cases.push_back({b, mxfp8_test::random_master(b.numel(), b.cols, 2, 0.0, false), {0, 0, b.numel()}});
  cases.push_back({c, mxfp8_test::random_master(c.numel(), c.cols, 3, 0.0, false), {0, 271, c.numel()}});
  cases[2].master[5] = std::numeric_limits<float>::infinity();
  check_batch(cases);
}

TEST(Nvfp4ShardBatch, CapturedReplaysEqualEager) {
  // One rank's two phases captured once; every replay (after new masters) equals the
  // per-tensor calls run eagerly on the same values.
  const std::vector<Nvfp4Shape> shapes = {{37, 45}, {16, 16}, {5, 301}};
  const std::vector<Range> ranges = {{101, 1234}, {0, 0}, {17, 1003}};
  std::vector<std::vector<float>> masters;
  std::vector<std::unique_ptr<RankTensor>> mine;
  std::vector<Nvfp4ShardTensor> tensors;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    masters.push_back(std::vector<float>(static_cast<std::size_t>(std::max<std::int64_t>(ranges[t].size(), 1))));
    mine.push_back(std::make_unique<RankTensor>(kHost, shapes[t]));
    const float* master = ranges[t].size() > 0 ? masters[t].data() : nullptr;
    tensors.push_back({shapes[t], ranges[t], master, mine[t]->amax.as<std::uint32_t>(), mine[t]->out.shard_planes(ranges[t])});
  }
  const Nvfp4ShardBatch batch(tensors, kHost);
  EXPECT_EQ(batch.size(), shapes.size());
  EXPECT_EQ(batch.numel(), 1133 + 0 + 986);
  HostStream stream;
  stream.begin_capture();
  nvfp4_partial_amax_batch(batch, kHost, stream.handle());
  quantize_nvfp4_shard_batch(batch, kHost, stream.handle());
  HostGraph graph = stream.end_capture();
  for (std::size_t t = 0; t < shapes.size(); ++t)
    EXPECT_EQ(download<std::uint32_t>(kHost, mine[t]->amax, 1)[0], kPoisonWord) << "capture ran the work";
  for (std::uint32_t rep = 0; rep < 3; ++rep) {
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const auto v = mxfp8_test::random_master(static_cast<std::int64_t>(masters[t].size()), 1, 40 + rep * 8 + t,
                                               0.02, rep == 2 && t == 0);
      std::copy(v.begin(), v.end(), masters[t].begin());  // new values in the captured buffers
    }
    graph.replay();
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const Nvfp4Shape& s = shapes[t];
      const RankTensor& m = *mine[t];
      const float* master = ranges[t].size() > 0 ? masters[t].data() : nullptr;
      nvfp4_partial_amax(s, ranges[t], master, m.call_amax.as<std::uint32_t>(), kHost, nullptr);
      quantize_nvfp4_shard(s, ranges[t], master, m.call_amax.as<std::uint32_t>(), m.call_out.shard_planes(ranges[t]),
                           kHost, nullptr);
      const auto n = static_cast<std::size_t>(s.amax_numel());
      EXPECT_TRUE(download<std::uint32_t>(kHost, m.amax, n) == download<std::uint32_t>(kHost, m.call_amax, n))
          << "replay " << rep << " tensor " << t << ": amax";
      EXPECT_TRUE(m.out.get(kHost, s) == m.call_out.get(kHost, s)) << "replay " << rep << " tensor " << t << ": planes";
    }
  }
}

template <class F>
void expect_error(F&& f, ErrorCode code, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needles.front() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << needle << " not in: " << e.what();
  }
}

TEST(Nvfp4ShardBatch, ErrorsNameTheTensor) {
  const Nvfp4Shape s{32, 32};  // 4 scale bytes, 5 amax entries
  std::vector<float> master(1024, 1.0f);
  RankTensor m0(kHost, s), m1(kHost, s), m2(kHost, s);
  auto tensor_of = [&](const RankTensor& m) {
    return Nvfp4ShardTensor{s, {0, 1024}, master.data(), m.amax.as<std::uint32_t>(), m.out.shard_planes({0, 1024})};
  };
  const Nvfp4ShardTensor good = tensor_of(m2);
  auto with = [&](Nvfp4ShardTensor bad) { return std::vector<Nvfp4ShardTensor>{tensor_of(m0), tensor_of(m1), bad}; };
  Nvfp4ShardTensor t = good;
  expect_error([] { Nvfp4ShardBatch({}, kHost); }, ErrorCode::InvalidArgument, {"empty"});
  t.range = {10, 3000};
  expect_error([&] { Nvfp4ShardBatch(with(t), kHost); }, ErrorCode::OutOfRange, {"tensor 2", "not inside"});
  t = good;
  t.shape = {0, 16};
  expect_error([&] { Nvfp4ShardBatch(with(t), kHost); }, ErrorCode::InvalidArgument, {"tensor 2", "positive"});
  t = good;
  t.master = nullptr;
  expect_error([&] { Nvfp4ShardBatch(with(t), kHost); }, ErrorCode::InvalidArgument, {"tensor 2", "master"});
  t = good;
  t.amax = nullptr;
  expect_error([&] { Nvfp4ShardBatch(with(t), kHost); }, ErrorCode::InvalidArgument, {"tensor 2", "amax is null"});
  t = good;
  t.out.data = nullptr;
  expect_error([&] { Nvfp4ShardBatch(with(t), kHost); }, ErrorCode::InvalidArgument, {"tensor 2", "out.data"});
  t = good;
  t.out.scale = nullptr;
  expect_error([&] { Nvfp4ShardBatch(with(t), kHost); }, ErrorCode::InvalidArgument, {"tensor 2", "out.scale"});
  t = good;
  t.out.scale = m0.out.planes().scale + 1;
  expect_error([&] { Nvfp4ShardBatch(with(t), kHost); }, ErrorCode::InvalidArgument,
               {"tensor 2", "scales overlaps the scales of tensor 0"});
  t = good;
  t.amax = m1.amax.as<std::uint32_t>() + 2;
  expect_error([&] { Nvfp4ShardBatch(with(t), kHost); }, ErrorCode::InvalidArgument,
               {"tensor 2", "amax buffer overlaps the amax buffer of tensor 1"});
  t = good;
  t.out.data = t.out.scale;  // one tensor's own outputs
  expect_error([&] { Nvfp4ShardBatch({t}, kHost); }, ErrorCode::InvalidArgument, {"tensor 0", "overlaps"});
  // An empty range needs neither a master nor data memory.
  t = good;
  t.range = {7, 7};
  t.master = nullptr;
  t.out.data = nullptr;
  Nvfp4ShardBatch batch({t}, kHost);
  expect_error([&] { nvfp4_partial_amax_batch(batch, Backend::Cuda, nullptr); }, ErrorCode::InvalidArgument,
               {"nvfp4_partial_amax_batch", "built for Backend::host"});
  expect_error([&] { quantize_nvfp4_shard_batch(batch, Backend::Cuda, nullptr); }, ErrorCode::InvalidArgument,
               {"quantize_nvfp4_shard_batch", "built for Backend::host"});
  Nvfp4ShardBatch moved = std::move(batch);
  expect_error([&] { nvfp4_partial_amax_batch(batch, kHost, nullptr); }, ErrorCode::InvalidState, {"moved from"});
  EXPECT_EQ(moved.size(), 1u);
}

}  // namespace
