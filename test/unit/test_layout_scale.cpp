// The layout of a 70B-like model (Llama-style: hidden 8192, 80 layers, MLP 28672, k/v
// 1024, vocabulary 128256) at world sizes 8 ... 16,384, against what a user would compute
// by hand: every element placed once, every rank's shard of the same size, padding no more
// than the alignment and bucket rounding allow, and the optimizer's bytes per rank
// ((2 + g) x N for params and grads, 12 x N / d for master and moments) within 0.1% of the
// unpadded formula (2 + g) x P + 12 x P / d.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "shardopt/layout.hpp"
#include "shardopt/presets.hpp"

namespace {
using namespace shardopt;

constexpr presets::TransformerShape k70B{8192, 80, 28672, 1024, 128256};

std::int64_t count_elements(const std::vector<ParamSpec>& specs) {
  std::int64_t p = 0;
  for (const ParamSpec& s : specs) {
    std::int64_t n = 1;
    for (std::int64_t e : s.shape) n *= e;
    p += n;
  }
  return p;
}

TEST(LayoutScale, Llama70BAtEightToSixteenThousandRanks) {
  const auto specs = presets::transformer(k70B);
  const std::int64_t P = count_elements(specs);
  // By hand: 2 x 128256 x 8192 + 8192 + 80 x (2 x 8192 + 2 x 8192^2 + 2 x 1024 x 8192 + 3 x 28672 x 8192).
  const std::int64_t by_hand = 2LL * 128256 * 8192 + 8192 +
                               80LL * (2 * 8192 + 2LL * 8192 * 8192 + 2LL * 1024 * 8192 + 3LL * 28672 * 8192);
  ASSERT_EQ(P, by_hand);
  ASSERT_EQ(P, 70'553'706'496);
  for (int d = 8; d <= 16384; d *= 2) {
    SCOPED_TRACE("world " + std::to_string(d));
    const Layout L(specs, d);
    const std::int64_t N = L.total_numel();
    EXPECT_EQ(L.param_numel(), P);
    EXPECT_EQ(N % d, 0);
    EXPECT_EQ(L.bucket_threshold(), std::max<std::int64_t>(40'000'000, 1'000'000LL * d));
    // Padding: at most alignment - 1 per parameter plus pad_multiple - 1 per bucket.
    const std::int64_t bound = static_cast<std::int64_t>(specs.size()) * (L.alignment() - 1) +
                               static_cast<std::int64_t>(L.buckets().size()) * (L.pad_multiple() - 1);
    EXPECT_LE(L.padding_numel(), bound);
    std::int64_t shard = 0;
    for (const BufferLayout& b : L.buffers()) {
      EXPECT_EQ(b.shard_numel * d, b.numel);
      shard += b.shard_numel;
    }
    for (const Bucket& k : L.buckets()) EXPECT_EQ(k.range.size() % d, 0);
    // Every rank's segments lie in its shard and together cover every element once.
    std::int64_t covered = 0;
    for (int r = 0; r < d; ++r)
      for (int b = 0; b < static_cast<int>(L.buffers().size()); ++b)
        for (const Segment& s : L.segments(b, r)) {
          EXPECT_LE(s.shard_offset + s.length, L.buffers()[static_cast<std::size_t>(b)].shard_numel);
          covered += s.length;
        }
    EXPECT_EQ(covered, P);
    // Bytes per rank with bf16 params and grads (g = 2) against the unpadded formula.
    const double layout_bytes = 4.0 * static_cast<double>(N) + 12.0 * static_cast<double>(shard);
    const double formula = 4.0 * static_cast<double>(P) + 12.0 * static_cast<double>(P) / d;
    EXPECT_NEAR(layout_bytes / formula, 1.0, 1e-3);
    // The optimizer state alone (12 bytes an element of the shard): what ZeRO divides.
    EXPECT_NEAR(12.0 * static_cast<double>(shard) / (12.0 * static_cast<double>(P) / d), 1.0, 1e-3);
  }
}

}  // namespace
