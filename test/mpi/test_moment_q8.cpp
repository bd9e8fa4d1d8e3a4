// 8-bit block-quantized moments (issue 46 part 2) on the host backend under mpiexec,
// 1-4 ranks: test/common/moment_q8_cases.hpp.
#include "common/moment_q8_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;
constexpr MasterStorage kFp32 = MasterStorage::fp32;
constexpr MasterStorage kRem = MasterStorage::bf16_remainder;

TEST(MomentQ8Host, DistributedAdamEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::DistAdam, false, kFp32); }
TEST(MomentQ8Host, DistributedAdamGraphEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::DistAdam, true, kFp32); }
TEST(MomentQ8Host, RemaindersDistributedAdamEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::DistAdam, false, kRem); }
TEST(MomentQ8Host, RemaindersFsdpGraphEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::Fsdp, true, kRem); }
TEST(MomentQ8Host, FsdpEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::Fsdp, false, kFp32); }
TEST(MomentQ8Host, HsdpEqualsUnsharded) { case_q8_equals_unsharded(kB, Front::Fsdp, false, kRem, 2); }
TEST(MomentQ8Host, StepWithinDerivedBound) { case_q8_step_bound(kB); }
TEST(MomentQ8Host, ResumeBitwise) { case_q8_resume_bitwise(kB, false, kFp32); }
TEST(MomentQ8Host, ResumeBitwiseGraphRemainders) { case_q8_resume_bitwise(kB, true, kRem); }
TEST(MomentQ8Host, CheckpointToQ8AcrossWorldsAndFrontEnds) {
  case_q8_reshard(kB, world_size(), Front::Fsdp, 1, Front::DistAdam, DType::q8_block);
  case_q8_reshard(kB, 1, Front::DistAdam, world_size(), Front::Fsdp, DType::q8_block);
}
TEST(MomentQ8Host, CheckpointToF32AndBf16) {
  case_q8_reshard(kB, world_size(), Front::DistAdam, world_size(), Front::DistAdam, DType::f32);
  case_q8_reshard(kB, world_size(), Front::Fsdp, 1, Front::DistAdam, DType::bf16);
}
TEST(MomentQ8Host, MemoryReportPerMode) { case_q8_memory_formula(kB); }
TEST(MomentQ8Host, BadInputIsAClearError) { case_q8_errors(kB); }

}  // namespace
