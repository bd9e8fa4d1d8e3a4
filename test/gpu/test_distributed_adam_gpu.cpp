// Distributed Adam on GPUs under mpirun, one GPU per rank (NCCL).
#include "common/dist_adam_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Cuda;

TEST(DistributedAdamGpu, ShardedEqualsUnshardedBitwiseF32Grads) { case_sharded_equals_unsharded(kB, DType::f32, 1, 6); }
TEST(DistributedAdamGpu, ShardedEqualsUnshardedBitwiseBf16Grads) { case_sharded_equals_unsharded(kB, DType::bf16, 2, 6); }
TEST(DistributedAdamGpu, RandomGradsWithinSummationOrderTolerance) { case_random_within_order_tolerance(kB, 8); }
TEST(DistributedAdamGpu, GraphReplayEqualsEager) { case_graph_equals_eager(kB, DType::bf16, 4, 20); }
TEST(DistributedAdamGpu, GraphReplayEqualsEagerF32Grads) { case_graph_equals_eager(kB, DType::f32, 2, 6); }
TEST(DistributedAdamGpu, GraphReplayEqualsEagerWithDeferredGathers) { case_graph_equals_eager(kB, DType::bf16, 2, 6, true); }
TEST(DistributedAdamGpu, InfInOneRankSkipsTheStepEverywhere) { case_inf_skips_everywhere(kB); }
TEST(DistributedAdamGpu, ZeroGradViewsAndCopies) { case_zero_grad_and_copies(kB); }
TEST(DistributedAdamGpu, ExternalSgdThroughShardGrad) { case_external_sgd(kB); }
TEST(DistributedAdamGpu, MismatchedSpecsAreAClearError) { case_mismatched_specs(kB); }
TEST(DistributedAdamGpu, MemoryReportEqualsFormula) { case_memory_formula(kB); }
TEST(DistributedAdamGpu, DeferredGatherEqualsImmediate) {
  case_same_as_plain(kB, [](DistributedAdamOptions& o) { o.overlap_param_gather = true; });
}
TEST(DistributedAdamGpu, PipelinedGroupedStepEqualsPlain) {
  case_same_as_plain(kB, [](DistributedAdamOptions& o) {
    o.gather_pipeline = 3;
    o.grouped_collectives = true;
  });
}

}  // namespace
