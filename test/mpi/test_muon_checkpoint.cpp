// Checkpoints of optimizers with Muon groups on the host backend under mpiexec (1-4
// ranks): resume bitwise (DistributedAdam, Fsdp, async save), reshard across world sizes
// (save at 3, load at 2 and 1) and front ends, AdamW <-> Muon checkpoints and hostile
// momentum entries refused (common/muon_checkpoint_cases.hpp, docs/checkpoints.md).
#include "common/muon_checkpoint_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
SHARDOPT_MUON_CHECKPOINT_CASES(MuonCheckpointHost, Backend::Host)
}  // namespace
