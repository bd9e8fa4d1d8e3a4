// 8-bit block-quantized moments (issue 46 part 2) on GPUs under mpirun, one GPU per rank,
// 1, 2 and 4 ranks: test/common/moment_q8_cases.hpp.
#include "common/moment_q8_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Cuda;
constexpr MasterStorage kFp32 = MasterStorage::fp32;
constexpr MasterStorage kRem = MasterStorage::bf16_remainder;

TEST(MomentQ8Gpu, DistributedAdamEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::DistAdam, false, kFp32); }
TEST(MomentQ8Gpu, DistributedAdamGraphEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::DistAdam, true, kFp32); }
TEST(MomentQ8Gpu, RemaindersDistributedAdamEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::DistAdam, false, kRem); }
TEST(MomentQ8Gpu, RemaindersFsdpGraphEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::Fsdp, true, kRem); }
TEST(MomentQ8Gpu, FsdpEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::Fsdp, false, kFp32); }
TEST(MomentQ8Gpu, HsdpEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::Fsdp, false, kRem, 2); }
TEST(MomentQ8Gpu, StepWithinDerivedBound) { case_q8_step_bound(kB); }
TEST(MomentQ8Gpu, ResumeBitwise) { case_q8_resume_bitwise(kB, false, kFp32); }
TEST(MomentQ8Gpu, ResumeBitwiseGraphRemainders) { case_q8_resume_bitwise(kB, true, kRem); }
TEST(MomentQ8Gpu, CheckpointToQ8AcrossWorldsAndFrontEnds) {
  case_q8_reshard(kB, world_size(), Front::Fsdp, 1, Front::DistAdam, DType::q8_block);
  case_q8_reshard(kB, 1, Front::DistAdam, world_size(), Front::Fsdp, DType::q8_block);
}
TEST(MomentQ8Gpu, CheckpointToF32AndBf16) {
  case_q8_reshard(kB, world_size(), Front::DistAdam, world_size(), Front::DistAdam, DType::f32);
  case_q8_reshard(kB, world_size(), Front::Fsdp, 1, Front::DistAdam, DType::bf16);
}
TEST(MomentQ8Gpu, MemoryReportPerMode) { case_q8_memory_formula(kB); }
TEST(MomentQ8Gpu, BadInputIsAClearError) { case_q8_errors(kB); }

}  // namespace
