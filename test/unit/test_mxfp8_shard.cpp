// The sharded MXFP8 protocol, proven by simulation on the host backend: W ranks each
// own a flat range of an fp32 master; phase 1 on every rank, a Max all-reduce, phase 2
// on every rank; the assembled bytes equal the oracle's quantization of bf16(full
// master) bitwise, for both exchange schemes, world sizes 1-8, shard boundaries at every
// offset within a block and across members, and the segments of a real Layout.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "kernels/mxfp8/mxfp8_shard_calls.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/presets.hpp"
#include "unit/test_mxfp8_common.hpp"

namespace {
using namespace shardopt;
using namespace mxfp8_test;
namespace ref = mxfp8_ref;

constexpr Backend kHost = Backend::Host;

TEST(Mxfp8Shard, WholeTensorOfBf16MasterMatchesReference) {
  // The target the sharded path must reproduce: the host whole-tensor quantize of
  // bf16(master), itself equal to the oracle.
  const Mxfp8Shape s{2, 37, 45};
  const auto master = random_master(s.numel(), s.cols, 1, 0.05);
  const auto x = to_bf16(master);
  EXPECT_TRUE(quantize_on(kHost, s, x) == reference(s, x));
}

TEST(Mxfp8Shard, TwoRanksBoundaryAtEveryElement) {
  // rows 37 = 32 + 5 and cols 45 = 32 + 13: every flat boundary position covers every
  // offset inside a rowwise block and inside a columnwise block, partial blocks and the
  // member boundary (element 1665) included.
  const Mxfp8Shape s{2, 37, 45};
  const auto master = random_master(s.numel(), s.cols, 2, 0.05);
  const auto want = reference(s, to_bf16(master));
  for (std::int64_t b = 0; b <= s.numel(); ++b)
    if (!check_sharding(kHost, s, master, want, {0, b, s.numel()})) return;
}

TEST(Mxfp8Shard, ThreeRanksWithAMiddleShardInsideOneBlock) {
  // A middle rank owning less than one block (and sometimes nothing), at every offset.
  const Mxfp8Shape s{1, 35, 40};
  const auto master = random_master(s.numel(), s.cols, 3, 0.05);
  const auto want = reference(s, to_bf16(master));
  for (std::int64_t b = 0; b + 40 <= s.numel(); b += 7)
    for (std::int64_t len : {0, 1, 5, 31, 33, 40})
      if (!check_sharding(kHost, s, master, want, {0, b, b + len, s.numel()})) return;
}

TEST(Mxfp8Shard, WorldSizes1To8EvenShiftedAndRandomBoundaries) {
  const std::vector<Mxfp8Shape> shapes = {{1, 64, 96}, {3, 40, 72}, {1, 33, 200}, {2, 70, 33}, {4, 8, 40}};
  std::mt19937 rng(4);
  std::uint32_t seed = 10;
  for (const auto& s : shapes) {
    const auto master = random_master(s.numel(), s.cols, seed++, 0.02);
    const auto want = reference(s, to_bf16(master));
    for (int world = 1; world <= 8; ++world) {
      for (std::int64_t shift = -33; shift <= 33; ++shift)
        if (!check_sharding(kHost, s, master, want, even_bounds(s.numel(), world, shift))) return;
      for (int t = 0; t < 8; ++t)
        if (!check_sharding(kHost, s, master, want, random_bounds(s.numel(), world, rng))) return;
    }
  }
}

TEST(Mxfp8Shard, MaxOfARankAmaxSitsOnTheBoundary) {
  // The block's largest value (or its NaN / Inf) on either side of a boundary that cuts
  // the block: each rank alone would pick another scale.
  const Mxfp8Shape s{1, 64, 64};
  for (float special : {1000.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    for (std::int64_t b : {std::int64_t{31}, std::int64_t{32}, std::int64_t{33}, std::int64_t{64 * 31 + 7}}) {
      auto master = random_master(s.numel(), s.cols, 5, 0.0, false);
      master[static_cast<std::size_t>(b - 1)] = special;  // last element of rank 0
      if (!check_sharding(kHost, s, master, reference(s, to_bf16(master)), {0, b, s.numel()})) return;
      master[static_cast<std::size_t>(b - 1)] = 0.5f;
      master[static_cast<std::size_t>(b)] = special;  // first element of rank 1
      if (!check_sharding(kHost, s, master, reference(s, to_bf16(master)), {0, b, s.numel()})) return;
    }
  }
}

TEST(Mxfp8Shard, LayoutSegmentsOfEveryRank) {
  // The integrator's view: a Layout places params in buckets, each rank owns segments
  // (param, param_offset, length, shard_offset) of its shard; the master of a segment
  // lives at master_shard + shard_offset. Phase 1 runs on every (rank, param), with an
  // empty range where a rank owns nothing of the param.
  const std::vector<ParamSpec> specs = {ParamSpec::grouped("moe.w1", 3, {40, 72}), ParamSpec::tensor("proj", {100, 64}),
                                        ParamSpec::tensor("norm", {64}, DType::bf16, "no_decay"),
                                        ParamSpec::tensor("head", {33, 100})};
  for (int world = 1; world <= 8; ++world) {
    LayoutOptions opt;
    opt.bucket_numel = 6000;  // several buckets
    const Layout layout(specs, world, opt);
    // Full masters per param, and each rank's shard of each buffer.
    std::vector<std::vector<float>> full(specs.size());
    for (std::size_t p = 0; p < specs.size(); ++p)
      full[p] = random_master(numel(layout.specs()[p].shape), layout.specs()[p].shape.back(), 100 + static_cast<int>(p), 0.01);
    for (std::size_t p = 0; p < specs.size(); ++p) {
      if (layout.specs()[p].shape.size() < 2) continue;  // 1-D: stays bf16
      const Mxfp8Shape s = Mxfp8Shape::of(layout.specs()[p]);
      const int buffer = layout.params()[p].buffer;
      // Collect every rank's ranges of this param.
      std::vector<std::pair<Range, std::vector<float>>> pieces;  // range, that rank's shard values
      for (int r = 0; r < world; ++r) {
        std::vector<float> shard(static_cast<std::size_t>(layout.buffers()[buffer].shard_numel), 0.0f);
        const auto segs = layout.segments(buffer, r);
        for (const Segment& g : segs)
          for (std::int64_t i = 0; i < g.length; ++i)
            shard[static_cast<std::size_t>(g.shard_offset + i)] = full[static_cast<std::size_t>(g.param)][static_cast<std::size_t>(g.param_offset + i)];
        bool owns = false;
        for (const Segment& g : segs) {
          if (g.param != static_cast<int>(p)) continue;
          owns = true;
          pieces.push_back({Range{g.param_offset, g.param_offset + g.length},
                            std::vector<float>(shard.begin() + g.shard_offset, shard.begin() + g.shard_offset + g.length)});
        }
        if (!owns) pieces.push_back({Range{0, 0}, {}});
      }
      // Phase 1 everywhere, Max, phase 2 everywhere (scheme A).
      std::vector<std::vector<std::uint8_t>> rows, cols;
      for (auto& [range, values] : pieces) {
        std::vector<std::uint8_t> sr(static_cast<std::size_t>(s.scale_row_numel()), kPoison), sc(static_cast<std::size_t>(s.scale_col_numel()), kPoison);
        mxfp8_partial_scales(s, range, values.data(), sr.data(), sc.data(), kHost, nullptr);
        rows.push_back(sr);
        cols.push_back(sc);
      }
      const auto srow = all_reduce_max(rows), scol = all_reduce_max(cols);
      std::vector<std::uint8_t> drow(static_cast<std::size_t>(s.numel()), kPoison), dcol(drow.size(), kPoison);
      for (auto& [range, values] : pieces)
        quantize_mxfp8_shard_data(s, range, values.data(), srow.data(), scol.data(), drow.data(), dcol.data(), kHost, nullptr);
      const auto want = reference(s, to_bf16(full[p]));
      ASSERT_TRUE(drow == want.data_row && dcol == want.data_col && srow == want.scale_row && scol == want.scale_col)
          << "param " << layout.specs()[p].name << " world " << world;
    }
  }
}

TEST(Mxfp8Shard, CapturedPipelineReplaysWithTheCurrentMaster) {
  // Phase 1, the (simulated) all-reduce and phase 2 of two ranks captured on a HostStream:
  // a replay quantizes whatever the master holds then, bitwise like eager execution.
  const Mxfp8Shape s{2, 40, 72};
  const std::int64_t b = 2017;  // mid-block, mid-member
  std::vector<float> master = random_master(s.numel(), s.cols, 6, 0.02);
  std::vector<std::uint8_t> sr0(static_cast<std::size_t>(s.scale_row_numel())), sr1(sr0.size());
  std::vector<std::uint8_t> sc0(static_cast<std::size_t>(s.scale_col_numel())), sc1(sc0.size());
  std::vector<std::uint8_t> drow(static_cast<std::size_t>(s.numel()), kPoison), dcol(drow.size(), kPoison);
  HostStream stream;
  stream.begin_capture();
  mxfp8_partial_scales(s, {0, b}, master.data(), sr0.data(), sc0.data(), kHost, stream.handle());
  mxfp8_partial_scales(s, {b, s.numel()}, master.data() + b, sr1.data(), sc1.data(), kHost, stream.handle());
  host_enqueue(stream.handle(), [&] {  // the Max all-reduce (each rank ends with the same bytes)
    for (std::size_t i = 0; i < sr0.size(); ++i) sr0[i] = sr1[i] = std::max(sr0[i], sr1[i]);
    for (std::size_t i = 0; i < sc0.size(); ++i) sc0[i] = sc1[i] = std::max(sc0[i], sc1[i]);
  });
  quantize_mxfp8_shard_data(s, {0, b}, master.data(), sr0.data(), sc0.data(), drow.data(), dcol.data(), kHost, stream.handle());
  quantize_mxfp8_shard_data(s, {b, s.numel()}, master.data() + b, sr1.data(), sc1.data(), drow.data(), dcol.data(), kHost,
                            stream.handle());
  const HostGraph graph = stream.end_capture();
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto next = random_master(s.numel(), s.cols, 60 + step, 0.02);  // Adam writes in place
    std::copy(next.begin(), next.end(), master.begin());
    graph.replay();
    const auto want = reference(s, to_bf16(master));
    ASSERT_TRUE(drow == want.data_row && dcol == want.data_col && sr0 == want.scale_row && sc1 == want.scale_col)
        << "step " << step;
  }
}

TEST(Mxfp8Shard, ExchangeBytesOfLlama32_1B) {
  // The cost of the two exchanges for the 2-D weights of Llama-3.2-1B (reported).
  std::int64_t params = 0, blocks = 0;
  for (const ParamSpec& p : presets::transformer(presets::kLlama32_1B)) {
    if (p.shape.size() < 2) continue;
    const Mxfp8Shape s = Mxfp8Shape::of(p);
    params += s.numel();
    blocks += s.scale_row_numel() + s.scale_col_numel();
  }
  EXPECT_EQ(blocks * 16, params);  // every Llama dim is a multiple of 32: 2 blocks per 32 elements
  std::printf("Llama-3.2-1B 2-D weights: %lld elements; scale exchange %lld bytes (%.4f B/param), "
              "u32 amax exchange %lld bytes (%.4f B/param), data planes %lld bytes (2 B/param)\n",
              static_cast<long long>(params), static_cast<long long>(blocks), double(blocks) / double(params),
              static_cast<long long>(4 * blocks), 4.0 * double(blocks) / double(params), static_cast<long long>(2 * params));
}

}  // namespace
