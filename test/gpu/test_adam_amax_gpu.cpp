// The fused Adam pass emitting the NVFP4 partial amaxes (issue 29) on a GPU: the kernel
// (shared slots, global fallback for a block row of 4096 blocks, vectors of 8 and 4,
// chunk edges mid-run) against a plain loop and nvfp4_partial_amax, 1-4 simulated ranks,
// NaN / Inf / -0 masters and a skipped step.
#include "unit/test_adam_amax_common.hpp"

namespace {
using shardopt::Backend;

TEST(AdamAmaxGpu, EmitsThePartialAmaxesOfEveryRank) { adam_amax_test::case_emits_partial_amaxes(Backend::Cuda); }
TEST(AdamAmaxGpu, RefusesAMissingTableAndParamWrites) { adam_amax_test::case_refusals(Backend::Cuda); }

}  // namespace
