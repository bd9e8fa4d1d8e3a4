// Optimizer state in pinned host memory, streamed through the step (issue 47), on GPUs
// under mpirun, one GPU per rank: pinned host arrays, a ring of device slots, copies on
// both copy engines.
#include "common/offload_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Cuda;

TEST(OffloadGpu, DistributedAdamEqualsOnGpu) { case_da_offload_equals_on_gpu(kB, 0.5, false); }
TEST(OffloadGpu, DistributedAdamAllOffloaded) { case_da_offload_equals_on_gpu(kB, 1.0, false); }
TEST(OffloadGpu, DistributedAdamGraph) { case_da_offload_equals_on_gpu(kB, 0.6, true); }
TEST(OffloadGpu, DistributedAdamRemainders) {
  case_da_offload_equals_on_gpu(kB, 0.7, false, MasterStorage::bf16_remainder);
}
TEST(OffloadGpu, DistributedAdamRemaindersGraph) {
  case_da_offload_equals_on_gpu(kB, 1.0, true, MasterStorage::bf16_remainder);
}
TEST(OffloadGpu, DistributedAdam8BitMoments) { case_da_offload_equals_on_gpu(kB, 0.5, false, MasterStorage::fp32, DType::q8_block); }
TEST(OffloadGpu, DistributedAdamRemainders8BitMomentsGraph) {
  case_da_offload_equals_on_gpu(kB, 1.0, true, MasterStorage::bf16_remainder, DType::q8_block);
}
TEST(OffloadGpu, DistributedAdamBf16Moments) { case_da_offload_equals_on_gpu(kB, 0.3, false, MasterStorage::fp32, DType::bf16); }
TEST(OffloadGpu, FsdpEqualsOnGpu) { case_fsdp_offload_equals_on_gpu(kB, 0.5, false); }
TEST(OffloadGpu, FsdpGraph) { case_fsdp_offload_equals_on_gpu(kB, 1.0, true); }
TEST(OffloadGpu, FsdpRemainders8BitMoments) {
  case_fsdp_offload_equals_on_gpu(kB, 0.6, false, 0, MasterStorage::bf16_remainder, DType::q8_block);
}
TEST(OffloadGpu, Hsdp) { case_fsdp_offload_equals_on_gpu(kB, 0.5, false, 2); }
TEST(OffloadGpu, MuonEqualsOnGpu) { case_muon_offload_equals_on_gpu(kB, 0.5, false); }
TEST(OffloadGpu, MuonAllOffloadedGraph) { case_muon_offload_equals_on_gpu(kB, 1.0, true); }
TEST(OffloadGpu, MuonRemainders8BitMoments) {
  case_muon_offload_equals_on_gpu(kB, 0.6, false, MasterStorage::bf16_remainder, DType::q8_block);
}
TEST(OffloadGpu, MuonRemaindersGraph) { case_muon_offload_equals_on_gpu(kB, 0.5, true, MasterStorage::bf16_remainder); }
TEST(OffloadGpu, MuonFsdp) { case_muon_fsdp_offload_equals_on_gpu(kB, 0.5); }
TEST(OffloadGpu, MuonHsdp) { case_muon_fsdp_offload_equals_on_gpu(kB, 1.0, 2); }
TEST(OffloadGpu, CheckpointsAcrossFractionsAndFrontEnds) { case_offload_checkpoints(kB); }
TEST(OffloadGpu, CheckpointsOfRemainders8BitMoments) {
  case_offload_checkpoints(kB, MasterStorage::bf16_remainder, DType::q8_block);
}
TEST(OffloadGpu, MemoryReport) { case_offload_memory(kB); }
TEST(OffloadGpu, BadInputAndRefusedPinnedMemory) { case_offload_errors(kB); }

}  // namespace
