// NVFP4 parameters inside DistributedAdam on GPUs under mpirun, one GPU per rank (NCCL):
// the cases of test/mpi/test_nvfp4_params.cpp (SHARDOPT_NVFP4_PARAMS_CASES of
// test/common/nvfp4_params_cases.hpp), run by test/gpu/run_mpi.sh.
#include "common/nvfp4_params_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
SHARDOPT_NVFP4_PARAMS_CASES(Nvfp4ParamsGpu, Backend::Cuda)
}  // namespace
