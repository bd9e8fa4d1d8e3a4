// Optimizer state in pinned host memory, streamed through the step (issue 47), on the
// host backend under mpiexec (1-4 ranks): the host twin copies between two host arenas
// through the same stage schedule as the GPUs.
#include "common/offload_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;

TEST(OffloadHost, DistributedAdamEqualsOnGpu) { case_da_offload_equals_on_gpu(kB, 0.5, false); }
TEST(OffloadHost, DistributedAdamAllOffloaded) { case_da_offload_equals_on_gpu(kB, 1.0, false); }
TEST(OffloadHost, DistributedAdamGraph) { case_da_offload_equals_on_gpu(kB, 0.6, true); }
TEST(OffloadHost, DistributedAdamRemainders) {
  case_da_offload_equals_on_gpu(kB, 0.7, false, MasterStorage::bf16_remainder);
}
TEST(OffloadHost, DistributedAdamRemaindersGraph) {
  case_da_offload_equals_on_gpu(kB, 1.0, true, MasterStorage::bf16_remainder);
}
TEST(OffloadHost, DistributedAdam8BitMoments) { case_da_offload_equals_on_gpu(kB, 0.5, false, MasterStorage::fp32, DType::q8_block); }
TEST(OffloadHost, DistributedAdamRemainders8BitMomentsGraph) {
  case_da_offload_equals_on_gpu(kB, 1.0, true, MasterStorage::bf16_remainder, DType::q8_block);
}
TEST(OffloadHost, DistributedAdamBf16Moments) { case_da_offload_equals_on_gpu(kB, 0.3, false, MasterStorage::fp32, DType::bf16); }
TEST(OffloadHost, FsdpEqualsOnGpu) { case_fsdp_offload_equals_on_gpu(kB, 0.5, false); }
TEST(OffloadHost, FsdpGraph) { case_fsdp_offload_equals_on_gpu(kB, 1.0, true); }
TEST(OffloadHost, FsdpRemainders8BitMoments) {
  case_fsdp_offload_equals_on_gpu(kB, 0.6, false, 0, MasterStorage::bf16_remainder, DType::q8_block);
}
TEST(OffloadHost, Hsdp) { case_fsdp_offload_equals_on_gpu(kB, 0.5, false, 2); }
TEST(OffloadHost, MuonEqualsOnGpu) { case_muon_offload_equals_on_gpu(kB, 0.5, false); }
TEST(OffloadHost, MuonAllOffloadedGraph) { case_muon_offload_equals_on_gpu(kB, 1.0, true); }
TEST(OffloadHost, MuonRemainders8BitMoments) {
  case_muon_offload_equals_on_gpu(kB, 0.6, false, MasterStorage::bf16_remainder, DType::q8_block);
}
TEST(OffloadHost, MuonRemaindersGraph) { case_muon_offload_equals_on_gpu(kB, 0.5, true, MasterStorage::bf16_remainder); }
TEST(OffloadHost, MuonFsdp) { case_muon_fsdp_offload_equals_on_gpu(kB, 0.5); }
TEST(OffloadHost, MuonHsdp) { case_muon_fsdp_offload_equals_on_gpu(kB, 1.0, 2); }
TEST(OffloadHost, CheckpointsAcrossFractionsAndFrontEnds) { case_offload_checkpoints(kB); }
TEST(OffloadHost, CheckpointsOfRemainders8BitMoments) {
  case_offload_checkpoints(kB, MasterStorage::bf16_remainder, DType::q8_block);
}
TEST(OffloadHost, MemoryReport) { case_offload_memory(kB); }
TEST(OffloadHost, BadInputAndRefusedPinnedMemory) { case_offload_errors(kB); }

}  // namespace
