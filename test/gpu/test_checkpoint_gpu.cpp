// Checkpoints on GPUs under mpirun, one GPU per rank (NCCL): resume, reshard (world size,
// bucket size, distributed Adam <-> FSDP, grouped <-> discrete, bf16 -> MXFP8), async save,
// and every bad checkpoint refused on every rank (common/checkpoint_cases.hpp).
#include "common/checkpoint_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
SHARDOPT_CHECKPOINT_CASES(CheckpointGpu, Backend::Cuda)
}  // namespace
