// FSDP and HSDP on the host backend under mpiexec (2 and 4 ranks).
#include "common/fsdp_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;

TEST(FsdpHost, EqualsDistributedAdamAndUnshardedBitwise) { case_fsdp_equals_dist_adam(kB, 0, 1, 5); }
TEST(FsdpHost, EqualsWithMicrobatchAccumulation) { case_fsdp_equals_dist_adam(kB, 0, 3, 3); }
TEST(FsdpHost, Hsdp2x2EqualsFsdp4) {
  if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";
  case_fsdp_equals_dist_adam(kB, 2, 2, 4);
}
TEST(FsdpHost, GraphReplayEqualsEager) { case_fsdp_graph_equals_eager(kB, 4, 20); }
TEST(FsdpHost, PrefetchNeverExposesAStaleSlot) { case_fsdp_prefetch_never_stale(kB, {}); }
TEST(FsdpHost, ChangedUnitOrderIsAClearError) { case_fsdp_order_change(kB); }
TEST(FsdpHost, MemoryEqualsFormula) { case_fsdp_memory(kB); }

}  // namespace
