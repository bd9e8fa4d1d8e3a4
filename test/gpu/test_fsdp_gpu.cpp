// FSDP and HSDP on GPUs under mpirun, one GPU per rank (NCCL).
#include "common/fsdp_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Cuda;

TEST(FsdpGpu, EqualsDistributedAdamAndUnshardedBitwise) { case_fsdp_equals_dist_adam(kB, 0, 1, 5); }
TEST(FsdpGpu, EqualsWithMicrobatchAccumulation) { case_fsdp_equals_dist_adam(kB, 0, 3, 3); }
TEST(FsdpGpu, Hsdp2x2EqualsFsdp4) {
  if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";
  case_fsdp_equals_dist_adam(kB, 2, 2, 4);
}
TEST(FsdpGpu, GraphReplayEqualsEager) { case_fsdp_graph_equals_eager(kB, 4, 20); }
// The gather stream sleeps ~2 ms before every gather: a compute stream that did not wait
// for the gather would snapshot the slot's previous contents.
TEST(FsdpGpu, PrefetchNeverExposesAStaleSlot) {
  case_fsdp_prefetch_never_stale(kB, [](Stream gs) { delay_stream(kB, gs, 2000); });
}
TEST(FsdpGpu, ChangedUnitOrderIsAClearError) { case_fsdp_order_change(kB); }
TEST(FsdpGpu, MemoryEqualsFormula) { case_fsdp_memory(kB); }

}  // namespace
