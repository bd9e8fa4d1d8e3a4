// The fused Adam pass emitting the NVFP4 partial amaxes (issue 29) on the host backend:
// the host twin against a plain loop and against nvfp4_partial_amax, 1-4 ranks.
#include "unit/test_adam_amax_common.hpp"

namespace {
using shardopt::Backend;

TEST(AdamAmax, EmitsThePartialAmaxesOfEveryRank) { adam_amax_test::case_emits_partial_amaxes(Backend::Host); }
TEST(AdamAmax, RefusesAMissingTableAndParamWrites) { adam_amax_test::case_refusals(Backend::Host); }

}  // namespace
