// The precision of the optimizer state (issue 46) on the host backend under mpiexec (1-4 ranks).
#include "common/state_precision_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;

TEST(StatePrecisionHost, RemainderEqualsFp32DistributedAdam) { case_da_remainder_equals_fp32(kB, false); }
TEST(StatePrecisionHost, RemainderEqualsFp32DistributedAdamGraph) { case_da_remainder_equals_fp32(kB, true); }
TEST(StatePrecisionHost, RemainderEqualsFp32DistributedAdamF32Grads) { case_da_remainder_equals_fp32(kB, false, DType::f32); }
TEST(StatePrecisionHost, RemainderSkippedStepChangesNothing) { case_da_remainder_skipped_step(kB); }
TEST(StatePrecisionHost, RemainderWithMuonGroups) { case_da_remainder_with_muon(kB); }
TEST(StatePrecisionHost, RemainderEqualsFp32Fsdp) { case_fsdp_remainder_equals_fp32(kB, false); }
TEST(StatePrecisionHost, RemainderEqualsFp32FsdpGraph) { case_fsdp_remainder_equals_fp32(kB, true); }
TEST(StatePrecisionHost, RemainderEqualsFp32Hsdp) { case_fsdp_remainder_equals_fp32(kB, false, 2); }
TEST(StatePrecisionHost, CheckpointRemainderToFp32) {
  case_remainder_reshard(kB, world_size(), Front::DistAdam, MasterStorage::bf16_remainder, world_size(), Front::DistAdam,
                         MasterStorage::fp32);
}
TEST(StatePrecisionHost, CheckpointFp32ToRemainderAcrossWorldsAndFrontEnds) {
  case_remainder_reshard(kB, world_size(), Front::DistAdam, MasterStorage::fp32, 1, Front::Fsdp,
                         MasterStorage::bf16_remainder);
}
TEST(StatePrecisionHost, CheckpointRemainderFsdpToRemainderDistributedAdam) {
  case_remainder_reshard(kB, 1, Front::Fsdp, MasterStorage::bf16_remainder, world_size(), Front::DistAdam,
                         MasterStorage::bf16_remainder);
}
TEST(StatePrecisionHost, MemoryReportPerMode) { case_state_memory_formula(kB); }
TEST(StatePrecisionHost, BadInputIsAClearError) { case_remainder_errors(kB); }

}  // namespace
