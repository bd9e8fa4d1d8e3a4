// The sharded NVFP4 protocol, proven by simulation on the host backend: W ranks each own
// a flat range of an fp32 master; phase 1 on every rank, a u32 Max all-reduce, phase 2
// on every rank, the data bytes gathered with a bitwise OR of the ranks' byte spans; the
// result equals the oracle's quantization of bf16(full master) bitwise, for shard
// boundaries at every element of a 16 x 16 block (odd ones mid-byte), world sizes 1-8,
// the tensor's amax on either side of a boundary, and non-finite values on one rank.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace {
using namespace shardopt;
using namespace nvfp4_test;
namespace ref = nvfp4_ref;

constexpr Backend kHost = Backend::Host;

// Runs the protocol and compares with the oracle; false after the first failure.
bool check_sharding(const Nvfp4Shape& s, const std::vector<float>& master, const ref::Quantized& want,
                    const std::vector<std::int64_t>& bounds) {
  std::string problems;
  const ref::Quantized got = simulate(kHost, s, master, bounds, &problems);
  const bool ok = problems.empty() && got == want;
  EXPECT_TRUE(ok) << "bounds " << bounds_str(bounds) << ": " << problems
                  << (got.data != want.data ? "data differs; " : "") << (got.scale != want.scale ? "scale differs; " : "")
                  << (got.amax != want.amax ? "amax differs; " : "")
                  << (got.decode_scale != want.decode_scale ? "decode_scale differs; " : "");
  return ok;
}

ref::Quantized reference_of_master(const Nvfp4Shape& s, const std::vector<float>& master) {
  return reference(s, mxfp8_test::to_bf16(master));
}

TEST(Nvfp4Shard, TwoRanksBoundaryAtEveryElement) {
  // rows 37 = 2 * 16 + 5 and cols 45 = 2 * 16 + 13 (odd: the two elements of a byte may
  // sit in two rows and two blocks): every flat boundary, so every position inside a full
  // and a partial block, at even and odd offsets.
  const Nvfp4Shape s{37, 45};
  const auto master = mxfp8_test::random_master(s.numel(), s.cols, 2, 0.05, false);
  const auto want = reference_of_master(s, master);
  for (std::int64_t b = 0; b <= s.numel(); ++b)
    if (!check_sharding(s, master, want, {0, b, s.numel()})) return;
}

TEST(Nvfp4Shard, AMiddleShardSmallerThanABlockAtEveryPosition) {
  const Nvfp4Shape s{32, 48};
  const auto master = mxfp8_test::random_master(s.numel(), s.cols, 3, 0.05, false);
  const auto want = reference_of_master(s, master);
  for (std::int64_t b = 0; b + 17 <= s.numel(); b += 3)
    for (std::int64_t len : {0, 1, 2, 3, 15, 16, 17})
      if (!check_sharding(s, master, want, {0, b, b + len, s.numel()})) return;
}

TEST(Nvfp4Shard, WorldSizes1To8EvenShiftedAndRandomBoundaries) {
  const std::vector<Nvfp4Shape> shapes = {{64, 96}, {33, 200}, {70, 33}, {17, 17}, {1, 301}, {301, 1}};
  std::mt19937 rng(4);
  std::uint32_t seed = 10;
  for (const auto& s : shapes) {
    const auto master = mxfp8_test::random_master(s.numel(), s.cols, seed++, 0.02, false);
    const auto want = reference_of_master(s, master);
    for (int world = 1; world <= 8; ++world) {
      for (std::int64_t shift = -17; shift <= 17; ++shift)
        if (!check_sharding(s, master, want, mxfp8_test::even_bounds(s.numel(), world, shift))) return;
      for (int t = 0; t < 8; ++t)
        if (!check_sharding(s, master, want, mxfp8_test::random_bounds(s.numel(), world, rng))) return;
    }
  }
}

TEST(Nvfp4Shard, TheTensorAmaxOnEitherSideOfABoundary) {
  // The largest value (or a NaN / Inf, which refuses the tensor on every rank) as the
  // last element of rank 0 or the first of rank 1, the boundary cutting a block.
  const Nvfp4Shape s{48, 48};
  for (float special : {1e6f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
    for (std::int64_t b : {std::int64_t{15}, std::int64_t{16}, std::int64_t{17}, std::int64_t{48 * 20 + 7}}) {
      auto master = mxfp8_test::random_master(s.numel(), s.cols, 5, 0.0, false);
      master[static_cast<std::size_t>(b - 1)] = special;
      if (!check_sharding(s, master, reference_of_master(s, master), {0, b, s.numel()})) return;
      master[static_cast<std::size_t>(b - 1)] = 0.5f;
      master[static_cast<std::size_t>(b)] = special;
      if (!check_sharding(s, master, reference_of_master(s, master), {0, b, s.numel()})) return;
    }
  }
}

TEST(Nvfp4Shard, MastersRoundToBf16First) {
  // Masters on bf16 ties, just above and below them, NaN and Inf among them.
  const Nvfp4Shape s{33, 40};
  const auto master = mxfp8_test::random_master(s.numel(), s.cols, 6, 0.2, false);
  if (!check_sharding(s, master, reference_of_master(s, master), {0, 333, 334, 901, s.numel()})) return;
  const auto with_nan = mxfp8_test::random_master(s.numel(), s.cols, 7, 0.01, true);
  check_sharding(s, with_nan, reference_of_master(s, with_nan), {0, 500, s.numel()});
}

TEST(Nvfp4Shard, ARankWritesItsOwnNibblesOnly) {
  // Range [3, 8) of a [1, 16] tensor: bytes 1..3, written from out.data[0] on (here the
  // plane's byte 1); element 2's nibble (the low one of byte 1) stays 0, element 3's is
  // the rank's; nothing outside the span is written.
  const Nvfp4Shape s{1, 16};
  const std::vector<float> master = {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6};
  std::vector<std::uint32_t> amax(static_cast<std::size_t>(s.amax_numel()), 0);
  amax[0] = amax[1] = ref::bits(6.0f);  // as the all-reduce would give
  DevicePlanes out(kHost, s);
  quantize_nvfp4_shard(s, {3, 8}, master.data() + 3, amax.data(), out.shard_planes({3, 8}), kHost, nullptr);
  const ref::Quantized q = out.get(kHost, s);
  EXPECT_EQ(q.data[0], kPoison);
  EXPECT_EQ(q.data[1], 0x70);
  EXPECT_EQ(q.data[2], 0x77);
  EXPECT_EQ(q.data[3], 0x77);
  EXPECT_EQ(q.data[4], kPoison);
  // Phase 1 of an empty range writes zeros everywhere (its share of the Max).
  std::vector<std::uint32_t> partial(static_cast<std::size_t>(s.amax_numel()), kPoisonWord);
  nvfp4_partial_amax(s, {5, 5}, nullptr, partial.data(), kHost, nullptr);
  for (std::uint32_t a : partial) EXPECT_EQ(a, 0u);
}

}  // namespace
