// GradReducePrecision::F32Accumulate in DistributedAdam, Fsdp and HSDP on the host backend
// (MPI), run under mpiexec with 2, 3, 4 and 8 ranks (HSDP in every shape of the world: 2 x 1, 3 x 1,
// 4 x 1, 2 x 2, 8 x 1, 4 x 2, 2 x 4 replicas x shard ranks): the cases
// shared with the GPU suite (common/grad_reduce_opt_cases.hpp).
#include "common/grad_reduce_opt_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_GRAD_REDUCE_OPT_CASES(GradReduceOptHost, Backend::Host)
}  // namespace
