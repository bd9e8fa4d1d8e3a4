// Checkpoints of optimizers with Muon groups on GPUs under mpirun, one GPU per rank (NCCL,
// cuBLAS Newton-Schulz with the default bf16 GEMMs): resume bitwise (DistributedAdam,
// Fsdp, HSDP, async save, through a StepGraph), reshard across world sizes and between
// front ends bitwise against a world of one, AdamW <-> Muon checkpoints and hostile
// momentum entries refused (common/muon_checkpoint_cases.hpp, docs/checkpoints.md). The
// reshard cases rely on a batched bf16 GEMM giving the bits of its matrices alone
// (MuonGpu.BatchedEqualShapesEqualOneByOneBitwise; docs/muon.md "What is bitwise on CUDA").
#include "common/muon_checkpoint_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
SHARDOPT_MUON_CHECKPOINT_CASES(MuonCheckpointGpu, Backend::Cuda)
}  // namespace
