// MXFP8 parameters in FSDP on the host backend under mpiexec (1-4 ranks): the cases of
// test/common/fsdp_mxfp8_cases.hpp.
#include "common/fsdp_mxfp8_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;

TEST(FsdpMxfp8Host, EqualsDistributedAdamAndOracleBitwise) { case_fsdp_mx_equals_dist_adam(kB, 1, 4); }
TEST(FsdpMxfp8Host, EqualsWithMicrobatches) { case_fsdp_mx_equals_dist_adam(kB, 2, 3); }

TEST(FsdpMxfp8Host, Hsdp2x2EqualsDistributedAdam) {
  if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";
  case_fsdp_mx_equals_dist_adam(kB, 2, 3, FsdpMxPath::Hsdp);
}
TEST(FsdpMxfp8Host, DelayedGathersNeverExposeAStalePlace) {
  case_fsdp_mx_equals_dist_adam(kB, 2, 3, FsdpMxPath::DelayedGathers);
}
TEST(FsdpMxfp8Host, GraphReplayEqualsEager) { case_fsdp_mx_graph_equals_eager(kB, 4, 20); }
TEST(FsdpMxfp8Host, TrainEvalTrainEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 2, 4, FsdpMxPath::TrainEvalTrain); }
TEST(FsdpMxfp8Host, EvalBeforeLearningEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 1, 3, FsdpMxPath::EvalFirst); }
TEST(FsdpMxfp8Host, TwoEvalsEqualDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 1, 4, FsdpMxPath::EvalTwice); }
TEST(FsdpMxfp8Host, NoPrefetchEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 2, 3, FsdpMxPath::NoPrefetch); }
TEST(FsdpMxfp8Host, NoKeepLastUnitEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 1, 3, FsdpMxPath::NoKeepLastUnit); }
TEST(FsdpMxfp8Host, GroupedEqualsDiscreteMembers) { case_fsdp_mx_grouped_vs_discrete(kB); }
TEST(FsdpMxfp8Host, OnePlanePerPassAndErrors) { case_fsdp_mx_one_plane_per_pass(kB); }
TEST(FsdpMxfp8Host, MemoryEqualsFormula) { case_fsdp_mx_memory(kB); }

}  // namespace
