// GradReducePrecision::F32Accumulate in DistributedAdam, Fsdp (and HSDP at 4 GPUs) on
// CUDA + NCCL, one GPU per rank (test/gpu/run_mpi.sh; registered once plain and once per
// NCCL_ALGO=Ring / Tree): the cases shared with the host suite
// (common/grad_reduce_opt_cases.hpp), whose oracles are computed on the host.
#include "common/grad_reduce_opt_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_GRAD_REDUCE_OPT_CASES(GradReduceOptGpu, Backend::Cuda)
}  // namespace
