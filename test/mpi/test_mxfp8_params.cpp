// MXFP8 parameters inside DistributedAdam on the host backend under mpiexec (2-4 ranks):
// the cases of test/common/mxfp8_params_cases.hpp.
#include "common/mxfp8_params_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;

TEST(Mxfp8ParamsHost, E8m0AllReduceMax) { case_e8m0_all_reduce_max(kB); }
TEST(Mxfp8ParamsHost, StoreStagedGatherThroughGradRegion) { case_store_staged_gather(kB); }
TEST(Mxfp8ParamsHost, MatchesOracleBf16Grads) { case_mx_matches_oracle(kB, DType::bf16, 1, 4); }
TEST(Mxfp8ParamsHost, MatchesOracleF32GradsMicrobatches) { case_mx_matches_oracle(kB, DType::f32, 2, 3); }
TEST(Mxfp8ParamsHost, MatchesOracleF16Grads) { case_mx_matches_oracle(kB, DType::f16, 1, 2); }
TEST(Mxfp8ParamsHost, MatchesOracleOneRank) { case_mx_matches_oracle(kB, DType::bf16, 2, 2, /*one_rank=*/true); }
TEST(Mxfp8ParamsHost, OneRankWritesStorageWithoutLanding) { case_one_rank_writes_storage(kB); }
TEST(Mxfp8ParamsHost, MasterEqualsNativeF32Params) { case_mx_master_equals_native(kB); }
TEST(Mxfp8ParamsHost, TrainTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::TrainTrain, false); }
TEST(Mxfp8ParamsHost, TrainTrainWithZeroGrad) { case_mx_path(kB, MxPath::TrainTrain, true); }
TEST(Mxfp8ParamsHost, TrainEvalTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::TrainEvalTrain, false); }
TEST(Mxfp8ParamsHost, TrainEvalTrainWithZeroGrad) { case_mx_path(kB, MxPath::TrainEvalTrain, true); }
TEST(Mxfp8ParamsHost, ForcedGatherThenTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::ForcedGather, false); }
TEST(Mxfp8ParamsHost, ForcedGatherThenTrainWithZeroGrad) { case_mx_path(kB, MxPath::ForcedGather, true); }
TEST(Mxfp8ParamsHost, FoundInfStepInTheMiddle) { case_mx_path(kB, MxPath::FoundInf, false); }
TEST(Mxfp8ParamsHost, DeferredForwardWaitsWithoutZeroGrad) { case_mx_path(kB, MxPath::Deferred, false); }
TEST(Mxfp8ParamsHost, DeferredEvalThenTrain) { case_mx_path(kB, MxPath::DeferredEval, false); }
TEST(Mxfp8ParamsHost, DeferredZeroGradLandsFirst) { case_mx_path(kB, MxPath::DeferredZeroGrad, false); }
TEST(Mxfp8ParamsHost, DeferredZeroGradLandsFirstMixedModel) { case_mx_path(kB, MxPath::DeferredZeroGrad, true); }
TEST(Mxfp8ParamsHost, StateMachineRefusalsAndQueries) { case_mx_state_machine(kB); }
TEST(Mxfp8ParamsHost, GroupedEqualsDiscreteMembers) { case_grouped_vs_discrete(kB, 1); }
TEST(Mxfp8ParamsHost, GroupedEqualsDiscreteMembersMicrobatches) { case_grouped_vs_discrete(kB, 2); }
TEST(Mxfp8ParamsHost, MemoryHasNoParamBufferForMxfp8) { case_mx_memory(kB); }
TEST(Mxfp8ParamsHost, GraphReplayEqualsEager) { case_mx_graph_equals_eager(kB, 2, 6, false, false); }
TEST(Mxfp8ParamsHost, OneGraphReplayEqualsEager) { case_mx_graph_equals_eager(kB, 3, 5, true, false); }
TEST(Mxfp8ParamsHost, GraphReplayEqualsEagerDeferred) { case_mx_graph_equals_eager(kB, 2, 5, false, true); }
TEST(Mxfp8ParamsHost, NativeInitFromMaster) { case_native_init_from_master(kB); }
TEST(Mxfp8ParamsHost, ZeroGradZeroesMxfp8Regions) { case_zero_grad_skips_landed(kB); }
TEST(Mxfp8ParamsHost, StepGathersIntoStorage) { case_step_gathers_into_storage(kB); }
TEST(Mxfp8ParamsHost, StoreGatherPlanes) { case_store_gather_planes(kB); }

}  // namespace
