// NVFP4 parameters inside DistributedAdam on the host backend under mpiexec (1-4 ranks):
// the format-generic cases of test/common/mxfp8_params_cases.hpp run with
// ParamFormat::Nvfp4, and the NVFP4 ones of test/common/nvfp4_params_cases.hpp.
#include "common/nvfp4_params_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
SHARDOPT_NVFP4_PARAMS_CASES(Nvfp4ParamsHost, Backend::Host)
}  // namespace
