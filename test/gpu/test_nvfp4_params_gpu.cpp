// NVFP4 parameters inside DistributedAdam on GPUs under mpirun, one GPU per rank (NCCL):
// the cases of test/mpi/test_nvfp4_params.cpp (format-generic ones from
// test/common/mxfp8_params_cases.hpp), run by test/gpu/run_mpi.sh.
#include "common/nvfp4_params_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Cuda;
constexpr ParamFormat kF = ParamFormat::Nvfp4;

TEST(Nvfp4ParamsGpu, StoreStagedGatherPerBucketBytes) { case_store_staged_rank_bytes(kB); }
TEST(Nvfp4ParamsGpu, MatchesOracleBf16Grads) { case_mx_matches_oracle(kB, DType::bf16, 1, 4, false, kF); }
TEST(Nvfp4ParamsGpu, MatchesOracleF32GradsMicrobatches) { case_mx_matches_oracle(kB, DType::f32, 2, 3, false, kF); }
TEST(Nvfp4ParamsGpu, MatchesOracleF16Grads) { case_mx_matches_oracle(kB, DType::f16, 1, 2, false, kF); }
TEST(Nvfp4ParamsGpu, MatchesOracleOneRank) { case_mx_matches_oracle(kB, DType::bf16, 2, 2, true, kF); }
TEST(Nvfp4ParamsGpu, MasterEqualsNativeF32Params) { case_mx_master_equals_native(kB, kF); }
TEST(Nvfp4ParamsGpu, TrainTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::TrainTrain, false, kF); }
TEST(Nvfp4ParamsGpu, TrainTrainWithZeroGrad) { case_mx_path(kB, MxPath::TrainTrain, true, kF); }
TEST(Nvfp4ParamsGpu, TrainEvalTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::TrainEvalTrain, false, kF); }
TEST(Nvfp4ParamsGpu, TrainEvalTrainWithZeroGrad) { case_mx_path(kB, MxPath::TrainEvalTrain, true, kF); }
TEST(Nvfp4ParamsGpu, ForcedGatherThenTrainWithoutZeroGrad) { case_mx_path(kB, MxPath::ForcedGather, false, kF); }
TEST(Nvfp4ParamsGpu, FoundInfStepInTheMiddle) { case_mx_path(kB, MxPath::FoundInf, false, kF); }
TEST(Nvfp4ParamsGpu, DeferredForwardWaitsWithoutZeroGrad) { case_mx_path(kB, MxPath::Deferred, false, kF); }
TEST(Nvfp4ParamsGpu, DeferredEvalThenTrain) { case_mx_path(kB, MxPath::DeferredEval, false, kF); }
TEST(Nvfp4ParamsGpu, DeferredZeroGradLandsFirstMixedModel) { case_mx_path(kB, MxPath::DeferredZeroGrad, true, kF); }
TEST(Nvfp4ParamsGpu, StateMachineRefusalsAndQueries) { case_mx_state_machine(kB, kF); }
TEST(Nvfp4ParamsGpu, GroupedEqualsDiscreteMembers) { case_grouped_vs_discrete(kB, 1, kF); }
TEST(Nvfp4ParamsGpu, GroupedEqualsDiscreteMembersMicrobatches) { case_grouped_vs_discrete(kB, 2, kF); }
TEST(Nvfp4ParamsGpu, MemoryHasNoParamBufferForNvfp4) { case_nvfp4_memory(kB); }
TEST(Nvfp4ParamsGpu, GraphReplayEqualsEager) { case_mx_graph_equals_eager(kB, 2, 6, false, false, kF); }
TEST(Nvfp4ParamsGpu, OneGraphReplayEqualsEager) { case_mx_graph_equals_eager(kB, 3, 5, true, false, kF); }
TEST(Nvfp4ParamsGpu, GraphReplayEqualsEagerDeferred) { case_mx_graph_equals_eager(kB, 2, 5, false, true, kF); }

}  // namespace
