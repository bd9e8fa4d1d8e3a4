// MXFP8 parameters in FSDP on the host backend under mpiexec (1-4 ranks): the cases of
// test/common/fsdp_mxfp8_cases.hpp.
#include "common/fsdp_mxfp8_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
SHARDOPT_FSDP_MXFP8_CASES(FsdpMxfp8Host, Backend::Host)
}  // namespace
