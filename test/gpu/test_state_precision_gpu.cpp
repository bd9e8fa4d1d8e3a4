// The precision of the optimizer state (issue 46) on GPUs under mpirun, one GPU per rank.
#include "common/state_precision_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Cuda;

TEST(StatePrecisionGpu, RemainderEqualsFp32DistributedAdam) { case_da_remainder_equals_fp32(kB, false); }
TEST(StatePrecisionGpu, RemainderEqualsFp32DistributedAdamGraph) { case_da_remainder_equals_fp32(kB, true); }
TEST(StatePrecisionGpu, RemainderEqualsFp32DistributedAdamF32Grads) { case_da_remainder_equals_fp32(kB, false, DType::f32); }
TEST(StatePrecisionGpu, RemainderSkippedStepChangesNothing) { case_da_remainder_skipped_step(kB); }
TEST(StatePrecisionGpu, RemainderWithMuonGroups) { case_da_remainder_with_muon(kB); }
TEST(StatePrecisionGpu, RemainderEqualsFp32Fsdp) { case_fsdp_remainder_equals_fp32(kB, false); }
TEST(StatePrecisionGpu, RemainderEqualsFp32FsdpGraph) { case_fsdp_remainder_equals_fp32(kB, true); }
TEST(StatePrecisionGpu, RemainderEqualsFp32Hsdp) { case_fsdp_remainder_equals_fp32(kB, false, 2); }
TEST(StatePrecisionGpu, CheckpointRemainderToFp32) {
  case_remainder_reshard(kB, world_size(), Front::DistAdam, MasterStorage::bf16_remainder, world_size(), Front::DistAdam,
                         MasterStorage::fp32);
}
TEST(StatePrecisionGpu, CheckpointFp32ToRemainderAcrossWorldsAndFrontEnds) {
  case_remainder_reshard(kB, world_size(), Front::DistAdam, MasterStorage::fp32, 1, Front::Fsdp,
                         MasterStorage::bf16_remainder);
}
TEST(StatePrecisionGpu, CheckpointRemainderFsdpToRemainderDistributedAdam) {
  case_remainder_reshard(kB, 1, Front::Fsdp, MasterStorage::bf16_remainder, world_size(), Front::DistAdam,
                         MasterStorage::bf16_remainder);
}
TEST(StatePrecisionGpu, MemoryReportPerMode) { case_state_memory_formula(kB); }
TEST(StatePrecisionGpu, BadInputIsAClearError) { case_remainder_errors(kB); }

}  // namespace
