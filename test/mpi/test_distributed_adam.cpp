// Distributed Adam on the host backend under mpiexec (1-4 ranks).
#include "common/dist_adam_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;

TEST(DistributedAdamHost, ShardedEqualsUnshardedBitwiseF32Grads) { case_sharded_equals_unsharded(kB, DType::f32, 1, 6); }
TEST(DistributedAdamHost, ShardedEqualsUnshardedBitwiseBf16Grads) { case_sharded_equals_unsharded(kB, DType::bf16, 2, 6); }
TEST(DistributedAdamHost, RandomGradsWithinSummationOrderTolerance) { case_random_within_order_tolerance(kB, 8); }
TEST(DistributedAdamHost, GraphReplayEqualsEager) { case_graph_equals_eager(kB, DType::bf16, 4, 20); }
TEST(DistributedAdamHost, GraphReplayEqualsEagerF32Grads) { case_graph_equals_eager(kB, DType::f32, 2, 6); }
TEST(DistributedAdamHost, GraphReplayEqualsEagerWithDeferredGathers) { case_graph_equals_eager(kB, DType::bf16, 2, 6, true); }
TEST(DistributedAdamHost, InfInOneRankSkipsTheStepEverywhere) { case_inf_skips_everywhere(kB); }
TEST(DistributedAdamHost, ZeroGradViewsAndCopies) { case_zero_grad_and_copies(kB); }
TEST(DistributedAdamHost, ExternalSgdThroughShardGrad) { case_external_sgd(kB); }
TEST(DistributedAdamHost, AverageIsSumThenDivideBitwise) { case_average_is_sum_then_divide(kB); }
TEST(DistributedAdamHost, ReplayStepRefusedInOneGraphMode) { case_replay_step_refused_in_one_graph_mode(kB); }
TEST(DistributedAdamHost, MismatchedSpecsAreAClearError) { case_mismatched_specs(kB); }
TEST(DistributedAdamHost, MemoryReportEqualsFormula) { case_memory_formula(kB); }
TEST(DistributedAdamHost, DeferredGatherEqualsImmediate) {
  case_same_as_plain(kB, [](DistributedAdamOptions& o) { o.overlap_param_gather = true; });
}
TEST(DistributedAdamHost, PipelinedGroupedStepEqualsPlain) {
  case_same_as_plain(kB, [](DistributedAdamOptions& o) {
    o.gather_pipeline = 3;
    o.grouped_collectives = true;
  });
}

}  // namespace
