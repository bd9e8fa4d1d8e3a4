// Many-rank proofs on the host backend (suite `manyrank`, mpiexec oversubscribed at 8,
// 16, 32 and 64 ranks; test/mpi/meson.build says which run where and
// docs/multinode.md how long they take). The cases are the 1-4 rank ones
// (common/*_cases.hpp) with the clipping threshold lowered so that clipping stays
// active when N ranks' grid gradients are averaged (their norm falls like 1/sqrt(N)).
// Grid gradients are integers / 64: their sums over up to 64 ranks are exact in f32
// (|sum| <= 512/64), and over up to 32 in bf16 (|sum| <= 256/64), so sharded equals
// unsharded bitwise there; an average over a power of two is an exact scaling.
#include "common/checkpoint_cases.hpp"
#include "common/dist_adam_cases.hpp"
#include "common/fsdp_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;
constexpr float kClip = 0.1f;  // active at up to ~1000 ranks of averaged grid gradients

/// small_model() with its grouped experts replaced by `members` members of 4 x 5.
std::vector<ParamSpec> experts_model(int members) {
  std::vector<ParamSpec> out;
  for (const ParamSpec& s : small_model()) {
    out.push_back(s.member_shapes.empty() ? s : ParamSpec::grouped("experts", members, {4, 5}, s.dtype, s.group));
  }
  return out;
}

TEST(ManyRankHost, DistributedAdamShardedEqualsUnshardedF32Grads) {
  case_sharded_equals_unsharded(kB, DType::f32, 2, 4, kClip);
}
TEST(ManyRankHost, DistributedAdamShardedEqualsUnshardedBf16Grads) {
  if (world_size() > 32) GTEST_SKIP() << "bf16 sums of grid gradients are exact up to 32 ranks";
  case_sharded_equals_unsharded(kB, DType::bf16, 2, 4, kClip);
}
TEST(ManyRankHost, DistributedAdamGraphEqualsEager) { case_graph_equals_eager(kB, DType::bf16, 2, 4); }
TEST(ManyRankHost, GroupedExpertsMoreMembersThanRanks) {
  const auto specs = experts_model(2 * world_size() + 1);
  case_sharded_equals_unsharded(kB, DType::f32, 1, 3, kClip, specs);
}
TEST(ManyRankHost, GroupedExpertsFewerMembersThanRanks) {
  ASSERT_GT(world_size(), 3);  // small_model()'s experts have 3 members
  case_sharded_equals_unsharded(kB, DType::f32, 1, 3, kClip, experts_model(3));
}
TEST(ManyRankHost, FsdpEqualsDistributedAdamAndUnsharded) { case_fsdp_equals_dist_adam(kB, 0, 2, 3, kClip); }
TEST(ManyRankHost, FsdpGraphEqualsEager) { case_fsdp_graph_equals_eager(kB, 2, 4); }
TEST(ManyRankHost, Hsdp8x4EqualsUnsharded) {
  if (world_size() != 32) GTEST_SKIP() << "HSDP 8 x 4 runs at 32 ranks";
  case_fsdp_equals_dist_adam(kB, 8, 2, 3, kClip);
}
TEST(ManyRankHost, Hsdp4x16EqualsUnsharded) {
  if (world_size() != 64) GTEST_SKIP() << "HSDP 4 x 16 runs at 64 ranks";
  case_fsdp_equals_dist_adam(kB, 4, 2, 3, kClip);
}

// Checkpoints saved at 64 ranks, loaded at 48, 24, 7 and 1 and in the other front end:
// every rank's master and moments then equal an unsharded run's, bitwise.
class ManyRankCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world_size() != 64) GTEST_SKIP() << "the checkpoint cases run at 64 ranks";
  }
};
TEST_F(ManyRankCheckpoint, Save64Load48) { case_reshard(kB, 64, Front::DistAdam, 48, Front::DistAdam, 3, 2); }
TEST_F(ManyRankCheckpoint, Save64Load24) { case_reshard(kB, 64, Front::DistAdam, 24, Front::DistAdam, 3, 2); }
TEST_F(ManyRankCheckpoint, Save64Load7) { case_reshard(kB, 64, Front::DistAdam, 7, Front::DistAdam, 3, 2); }
TEST_F(ManyRankCheckpoint, Save64Load1) { case_reshard(kB, 64, Front::DistAdam, 1, Front::DistAdam, 3, 2); }
TEST_F(ManyRankCheckpoint, Save64DistAdamLoad48Fsdp) { case_reshard(kB, 64, Front::DistAdam, 48, Front::Fsdp, 3, 2); }
TEST_F(ManyRankCheckpoint, Save64FsdpLoad7DistAdam) { case_reshard(kB, 64, Front::Fsdp, 7, Front::DistAdam, 3, 2); }
TEST_F(ManyRankCheckpoint, Save64FsdpLoad1Fsdp) { case_reshard(kB, 64, Front::Fsdp, 1, Front::Fsdp, 3, 2); }

}  // namespace
