// MXFP8 parameters inside DistributedAdam on GPUs under mpirun, one GPU per rank (NCCL):
// the cases of test/common/mxfp8_params_cases.hpp, run by test/gpu/run_mpi.sh.
#include "common/mxfp8_params_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Cuda;

TEST(Mxfp8ParamsGpu, E8m0AllReduceMax) { case_e8m0_all_reduce_max(kB); }
TEST(Mxfp8ParamsGpu, StoreStagedGatherThroughGradRegion) { case_store_staged_gather(kB); }
TEST(Mxfp8ParamsGpu, MatchesOracleBf16Grads) { case_mx_matches_oracle(kB, DType::bf16, 1, 4); }
TEST(Mxfp8ParamsGpu, MatchesOracleF32GradsMicrobatches) { case_mx_matches_oracle(kB, DType::f32, 2, 3); }
TEST(Mxfp8ParamsGpu, MatchesOracleF16Grads) { case_mx_matches_oracle(kB, DType::f16, 1, 2); }
TEST(Mxfp8ParamsGpu, MatchesOracleOneRank) { case_mx_matches_oracle(kB, DType::bf16, 2, 2, /*one_rank=*/true); }
TEST(Mxfp8ParamsGpu, OneRankWritesStorageWithoutLanding) { case_one_rank_writes_storage(kB); }
TEST(Mxfp8ParamsGpu, MasterEqualsNativeF32Params) { case_mx_master_equals_native(kB); }
TEST(Mxfp8ParamsGpu, TrainTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::TrainTrain, false); }
TEST(Mxfp8ParamsGpu, TrainTrainWithZeroGrad) { case_mx_path(kB, MxPath::TrainTrain, true); }
TEST(Mxfp8ParamsGpu, TrainEvalTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::TrainEvalTrain, false); }
TEST(Mxfp8ParamsGpu, TrainEvalTrainWithZeroGrad) { case_mx_path(kB, MxPath::TrainEvalTrain, true); }
TEST(Mxfp8ParamsGpu, ForcedGatherThenTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::ForcedGather, false); }
TEST(Mxfp8ParamsGpu, ForcedGatherThenTrainWithZeroGrad) { case_mx_path(kB, MxPath::ForcedGather, true); }
TEST(Mxfp8ParamsGpu, FoundInfStepInTheMiddle) { case_mx_path(kB, MxPath::FoundInf, false); }
TEST(Mxfp8ParamsGpu, DeferredForwardWaitsWithoutZeroGrad) { case_mx_path(kB, MxPath::Deferred, false); }
TEST(Mxfp8ParamsGpu, DeferredEvalThenTrain) { case_mx_path(kB, MxPath::DeferredEval, false); }
TEST(Mxfp8ParamsGpu, DeferredZeroGradLandsFirst) { case_mx_path(kB, MxPath::DeferredZeroGrad, false); }
TEST(Mxfp8ParamsGpu, DeferredZeroGradLandsFirstMixedModel) { case_mx_path(kB, MxPath::DeferredZeroGrad, true); }
TEST(Mxfp8ParamsGpu, StateMachineRefusalsAndQueries) { case_mx_state_machine(kB); }
TEST(Mxfp8ParamsGpu, GroupedEqualsDiscreteMembers) { case_grouped_vs_discrete(kB, 1); }
TEST(Mxfp8ParamsGpu, GroupedEqualsDiscreteMembersMicrobatches) { case_grouped_vs_discrete(kB, 2); }
TEST(Mxfp8ParamsGpu, MemoryHasNoParamBufferForMxfp8) { case_mx_memory(kB); }
TEST(Mxfp8ParamsGpu, GraphReplayEqualsEager) { case_mx_graph_equals_eager(kB, 2, 6, false, false); }
TEST(Mxfp8ParamsGpu, OneGraphReplayEqualsEager) { case_mx_graph_equals_eager(kB, 3, 5, true, false); }
TEST(Mxfp8ParamsGpu, GraphReplayEqualsEagerDeferred) { case_mx_graph_equals_eager(kB, 2, 5, false, true); }
TEST(Mxfp8ParamsGpu, NativeInitFromMaster) { case_native_init_from_master(kB); }
TEST(Mxfp8ParamsGpu, ZeroGradZeroesMxfp8Regions) { case_zero_grad_skips_landed(kB); }
TEST(Mxfp8ParamsGpu, StepGathersIntoStorage) { case_step_gathers_into_storage(kB); }
TEST(Mxfp8ParamsGpu, StoreGatherPlanes) { case_store_gather_planes(kB); }

}  // namespace
