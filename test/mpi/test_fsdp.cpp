// FSDP and HSDP on the host backend under mpiexec (2, 3, 4 and 6 ranks). At 6 ranks only
// the HSDP cases run (3 x 2 and 2 x 3), the rest is covered at 2, 3 and 4 ranks.
#include "common/fsdp_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;

#define SKIP_AT_SIX_RANKS() \
  if (world_size() == 6) GTEST_SKIP() << "at 6 ranks only the HSDP cases run"

TEST(FsdpHost, EqualsDistributedAdamAndUnshardedBitwise) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_equals_dist_adam(kB, 0, 1, 5);
}
TEST(FsdpHost, EqualsWithMicrobatchAccumulation) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_equals_dist_adam(kB, 0, 3, 3);
}
TEST(FsdpHost, Hsdp2x2EqualsFsdp4) {
  if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";
  case_fsdp_equals_dist_adam(kB, 2, 2, 4);
}
// Shard groups of 3, two replicas; and shard groups of 2, three replicas (a replica
// count that is not a power of two).
TEST(FsdpHost, Hsdp3x2EqualsUnsharded) {
  if (world_size() != 6) GTEST_SKIP() << "HSDP 3 x 2 needs 6 ranks";
  case_fsdp_equals_dist_adam(kB, 3, 2, 3);
}
TEST(FsdpHost, Hsdp2x3EqualsUnsharded) {
  if (world_size() != 6) GTEST_SKIP() << "HSDP 2 x 3 needs 6 ranks";
  case_fsdp_equals_dist_adam(kB, 2, 2, 3);
}
TEST(FsdpHost, AverageIsSumThenDivideBitwise) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_average_is_sum_then_divide(kB);
}
TEST(FsdpHost, GraphReplayEqualsEager) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_graph_equals_eager(kB, 4, 20);
}
// The gather stream (on the host: the caller's stream) sleeps before each wait_param; a
// host gather lands only when waited, so a missing wait reads the slot's stale bytes.
TEST(FsdpHost, PrefetchNeverExposesAStaleSlot) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_prefetch_never_stale(kB, [](Stream gs) { delay_stream(kB, gs, 1000); });
}
TEST(FsdpHost, ChangedUnitOrderIsAClearError) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_order_change(kB);
}
TEST(FsdpHost, EndForwardOnlyRefusedAfterBackwardOrWithTheGradientSlot) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_end_forward_only_refused(kB);
}
TEST(FsdpHost, CaptureRefusedBeforeTheOrderIsLearnedOrWithCastCopies) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_capture_refused(kB);
}
TEST(FsdpHost, MemoryEqualsFormula) {
  SKIP_AT_SIX_RANKS();
  case_fsdp_memory(kB);
}

}  // namespace
