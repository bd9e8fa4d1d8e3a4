// NVFP4 parameters inside DistributedAdam on the host backend under mpiexec (1-4 ranks):
// the format-generic cases of test/common/mxfp8_params_cases.hpp run with
// ParamFormat::Nvfp4, and the NVFP4 ones of test/common/nvfp4_params_cases.hpp.
#include "common/nvfp4_params_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;
constexpr ParamFormat kF = ParamFormat::Nvfp4;

TEST(Nvfp4ParamsHost, StoreStagedGatherPerBucketBytes) { case_store_staged_rank_bytes(kB); }
TEST(Nvfp4ParamsHost, MatchesOracleBf16Grads) { case_mx_matches_oracle(kB, DType::bf16, 1, 4, false, kF); }
TEST(Nvfp4ParamsHost, MatchesOracleF32GradsMicrobatches) { case_mx_matches_oracle(kB, DType::f32, 2, 3, false, kF); }
TEST(Nvfp4ParamsHost, MatchesOracleF16Grads) { case_mx_matches_oracle(kB, DType::f16, 1, 2, false, kF); }
TEST(Nvfp4ParamsHost, MatchesOracleOneRank) { case_mx_matches_oracle(kB, DType::bf16, 2, 2, true, kF); }
TEST(Nvfp4ParamsHost, MasterEqualsNativeF32Params) { case_mx_master_equals_native(kB, kF); }
TEST(Nvfp4ParamsHost, TrainTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::TrainTrain, false, kF); }
TEST(Nvfp4ParamsHost, TrainTrainWithZeroGrad) { case_mx_path(kB, MxPath::TrainTrain, true, kF); }
TEST(Nvfp4ParamsHost, TrainEvalTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::TrainEvalTrain, false, kF); }
TEST(Nvfp4ParamsHost, TrainEvalTrainWithZeroGrad) { case_mx_path(kB, MxPath::TrainEvalTrain, true, kF); }
TEST(Nvfp4ParamsHost, ForcedGatherThenTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::ForcedGather, false, kF); }
TEST(Nvfp4ParamsHost, FoundInfStepInTheMiddle) { case_mx_path(kB, MxPath::FoundInf, false, kF); }
TEST(Nvfp4ParamsHost, DeferredForwardWaitsWithoutZeroGrad) { case_mx_path(kB, MxPath::Deferred, false, kF); }
TEST(Nvfp4ParamsHost, DeferredEvalThenTrain) { case_mx_path(kB, MxPath::DeferredEval, false, kF); }
TEST(Nvfp4ParamsHost, DeferredZeroGradLandsFirstMixedModel) { case_mx_path(kB, MxPath::DeferredZeroGrad, true, kF); }
TEST(Nvfp4ParamsHost, StateMachineRefusalsAndQueries) { case_mx_state_machine(kB, kF); }
TEST(Nvfp4ParamsHost, GroupedEqualsDiscreteMembers) { case_grouped_vs_discrete(kB, 1, kF); }
TEST(Nvfp4ParamsHost, GroupedEqualsDiscreteMembersMicrobatches) { case_grouped_vs_discrete(kB, 2, kF); }
TEST(Nvfp4ParamsHost, MemoryHasNoParamBufferForNvfp4) { case_nvfp4_memory(kB); }
TEST(Nvfp4ParamsHost, GraphReplayEqualsEager) { case_mx_graph_equals_eager(kB, 2, 6, false, false, kF); }
TEST(Nvfp4ParamsHost, OneGraphReplayEqualsEager) { case_mx_graph_equals_eager(kB, 3, 5, true, false, kF); }
TEST(Nvfp4ParamsHost, GraphReplayEqualsEagerDeferred) { case_mx_graph_equals_eager(kB, 2, 5, false, true, kF); }

}  // namespace
