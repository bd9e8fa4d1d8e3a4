// MXFP8 parameters in FSDP on GPUs under mpirun, one GPU per rank (NCCL): the cases of
// test/common/fsdp_mxfp8_cases.hpp.
#include "common/fsdp_mxfp8_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Cuda;

TEST(FsdpMxfp8Gpu, EqualsDistributedAdamAndOracleBitwise) { case_fsdp_mx_equals_dist_adam(kB, 1, 4); }
TEST(FsdpMxfp8Gpu, EqualsWithMicrobatches) { case_fsdp_mx_equals_dist_adam(kB, 2, 3); }

TEST(FsdpMxfp8Gpu, Hsdp2x2EqualsDistributedAdam) {
  if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";
  case_fsdp_mx_equals_dist_adam(kB, 2, 3, FsdpMxPath::Hsdp);
}
TEST(FsdpMxfp8Gpu, DelayedGathersNeverExposeAStalePlace) {
  case_fsdp_mx_equals_dist_adam(kB, 2, 3, FsdpMxPath::DelayedGathers);
}
TEST(FsdpMxfp8Gpu, GraphReplayEqualsEager) { case_fsdp_mx_graph_equals_eager(kB, 4, 20); }
TEST(FsdpMxfp8Gpu, TrainEvalTrainEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 2, 4, FsdpMxPath::TrainEvalTrain); }
TEST(FsdpMxfp8Gpu, EvalBeforeLearningEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 1, 3, FsdpMxPath::EvalFirst); }
TEST(FsdpMxfp8Gpu, TwoEvalsEqualDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 1, 4, FsdpMxPath::EvalTwice); }
TEST(FsdpMxfp8Gpu, NoPrefetchEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 2, 3, FsdpMxPath::NoPrefetch); }
TEST(FsdpMxfp8Gpu, NoKeepLastUnitEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(kB, 1, 3, FsdpMxPath::NoKeepLastUnit); }
TEST(FsdpMxfp8Gpu, GroupedEqualsDiscreteMembers) { case_fsdp_mx_grouped_vs_discrete(kB); }
TEST(FsdpMxfp8Gpu, OnePlanePerPassAndErrors) { case_fsdp_mx_one_plane_per_pass(kB); }
TEST(FsdpMxfp8Gpu, MemoryEqualsFormula) { case_fsdp_mx_memory(kB); }

}  // namespace
