// MXFP8 parameters in FSDP on GPUs under mpirun, one GPU per rank (NCCL): the cases of
// test/common/fsdp_mxfp8_cases.hpp.
#include "common/fsdp_mxfp8_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
SHARDOPT_FSDP_MXFP8_CASES(FsdpMxfp8Gpu, Backend::Cuda)
}  // namespace
