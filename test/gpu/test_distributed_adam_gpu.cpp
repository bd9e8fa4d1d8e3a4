// Distributed Adam on GPUs under mpirun, one GPU per rank (NCCL).
#include <cuda_runtime.h>

#include <string>

#include "common/dist_adam_cases.hpp"
#include "common/error_of.hpp"
#include "core/memory.hpp"

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

// More device memory than the GPU has is Error(OutOfMemory) naming the bytes, for plain
// and NCCL-registered buffers alike (ncclMemAlloc's own failure code is read as the memory
// it is), and the device stays usable afterwards.
TEST(DistributedAdamGpu, MoreMemoryThanTheDeviceHasIsOutOfMemory) {
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  for (MemoryKind kind : {MemoryKind::Device, MemoryKind::NcclDevice}) {
    const auto e = error_of([&] { DeviceBuffer b(kB, total + (std::size_t{1} << 30), kind); });
    ASSERT_TRUE(e.has_value()) << "an allocation larger than the device was granted";
    EXPECT_EQ(e->code(), ErrorCode::OutOfMemory) << e->what();
    EXPECT_NE(std::string(e->what()).find(std::to_string(total + (std::size_t{1} << 30))), std::string::npos)
        << e->what();
  }
  // A model whose bf16 parameters alone take more than the device: OutOfMemory from the
  // constructor, registered buffers or not; then a small optimizer builds and steps.
  const std::int64_t cols = std::int64_t{1} << 16;
  const auto rows = static_cast<std::int64_t>(total / 2 / static_cast<std::size_t>(cols)) + 1;
  for (bool registered : {true, false}) {
    DistributedAdamOptions o = base_options(DType::bf16);
    o.param_dtype = DType::bf16;
    o.nccl_registered = registered;
    const auto e = error_of([&] {
      DistributedAdam opt(make_comm(kB), {ParamSpec::tensor("w", {rows / 2, cols}), ParamSpec::tensor("u", {rows / 2 + 1, cols})}, o);
    });
    ASSERT_TRUE(e.has_value()) << "a model larger than the device was built";
    EXPECT_EQ(e->code(), ErrorCode::OutOfMemory) << e->what();
  }
  TestStream s(kB);
  DistributedAdam opt(make_comm(kB), small_model(), base_options(DType::f32));
  opt.init_master(s.get());
  opt.zero_grad(s.get());
  opt.step(s.get());
  opt.synchronize(s.get());
  EXPECT_EQ(opt.read_scalars(s.get()).step, 1);
}

}  // namespace
