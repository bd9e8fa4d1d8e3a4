// The fused Adam step of MXFP8 shards (issue 29) on the host backend, whose twin is the
// composition itself (Adam over the owned bands, then the owned pass): the plain chunks
// and the bands cover each rank's pieces, the fused composition equals today's bitwise,
// matches the oracle quantization and Adam in double, and the pass refuses bad tables.
#include "unit/test_adam_mxfp8_common.hpp"

namespace {
using shardopt::Backend;
using shardopt::DType;

TEST(AdamMxfp8, FusedEqualsTodaysCompositionOnEveryRank) {
  for (int world : {1, 3, 8}) adam_mxfp8_test::run_case(Backend::Host, world, DType::bf16, DType::f32, true, 11u + world);
  adam_mxfp8_test::run_case(Backend::Host, 2, DType::f32, DType::bf16, false, 5u);
  adam_mxfp8_test::run_case(Backend::Host, 1, DType::f16, DType::bf16, false, 3u);  // Adam (L2) against double
}

// Compact moments (ShardChunk::moment_shift, as after Muon pieces): the fused pass indexes
// the moments with the shift, as plain Adam does; a shift of 8 keeps 16-byte accesses, 5
// takes the element path. At one rank also against Adam in double.
TEST(AdamMxfp8, FusedEqualsTodaysCompositionWithMomentShift) {
  for (std::int64_t shift : {8, 5}) {
    adam_mxfp8_test::run_case(Backend::Host, 1, DType::bf16, DType::f32, true, 21u, shift);
    adam_mxfp8_test::run_case(Backend::Host, 3, DType::bf16, DType::bf16, false, 22u, shift);
  }
}

TEST(AdamMxfp8, RefusesBadTables) { adam_mxfp8_test::case_refusals(Backend::Host); }

// adam_mxfp8_plain_chunks: pieces minus bands, cut inside, at the edges, and across pieces.
TEST(AdamMxfp8, PlainChunksArePiecesWithoutTheBands) {
  using shardopt::ShardChunk;
  auto chunk = [](std::int64_t s, std::int64_t len, std::int32_t group = 0) {
    ShardChunk c;
    c.shard_offset = s;
    c.buffer_offset = s + 1000;
    c.length = len;
    c.group = group;
    return c;
  };
  const std::vector<ShardChunk> pieces = {chunk(0, 100), chunk(100, 50, 1), chunk(150, 10)};
  const std::vector<ShardChunk> bands = {chunk(0, 20), chunk(40, 10), chunk(90, 30, 1), chunk(150, 10)};
  const std::vector<ShardChunk> got = shardopt::kernels::adam_mxfp8_plain_chunks(pieces, bands);
  const std::vector<std::pair<std::int64_t, std::int64_t>> want = {{20, 20}, {50, 40}, {120, 30}};
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].shard_offset, want[i].first) << i;
    EXPECT_EQ(got[i].length, want[i].second) << i;
    EXPECT_EQ(got[i].buffer_offset, got[i].shard_offset + 1000) << i;
  }
  EXPECT_EQ(got[2].group, 1);
  EXPECT_EQ(shardopt::kernels::adam_mxfp8_plain_chunks(pieces, {}).size(), pieces.size());
}

}  // namespace
