// GradReducePrecision::F32Accumulate in DistributedAdam, Fsdp and HSDP on the host backend
// (MPI), run under mpiexec with 2, 3 and 4 ranks (HSDP at 4: two groups of 2): the cases
// shared with the GPU suite (common/grad_reduce_opt_cases.hpp).
#include "common/grad_reduce_opt_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_GRAD_REDUCE_OPT_CASES(GradReduceOptHost, Backend::Host)
}  // namespace
