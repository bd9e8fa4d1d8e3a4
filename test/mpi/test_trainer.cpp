// The example trainer's regression tests on the host backend under mpiexec (1, 2 and 4
// ranks in CI). The cases are shared with the GPU suite (test_trainer_cases.hpp).
#include "test_trainer_cases.hpp"

namespace trainer::test {
namespace {

constexpr shardopt::Backend kHost = shardopt::Backend::Host;

// ---- loss below the stated threshold within the stated steps, every mode

TEST(TrainerHost, LossBelowThresholdDistAdam) { case_loss_below_threshold(kHost, "dist-adam", "single", "fp32"); }
TEST(TrainerHost, LossBelowThresholdDistAdamDiscreteBf16Grads) {
  case_loss_below_threshold(kHost, "dist-adam", "discrete", "bf16");
}
TEST(TrainerHost, LossBelowThresholdFsdp) { case_loss_below_threshold(kHost, "fsdp", "single", "bf16"); }
TEST(TrainerHost, LossBelowThresholdFsdpDiscrete) { case_loss_below_threshold(kHost, "fsdp", "discrete", "fp32"); }

// ---- graph replay vs eager: per-group gradient norms, 10 steps x 4 microbatches (seed 000)

TEST(TrainerHost, GraphEqualsEagerOneGraph) {
  compare_graph_and_eager(kHost, "dist-adam", "single", /*one_graph=*/true, false, 10, 4, true);
}
TEST(TrainerHost, GraphEqualsEagerSplitGraphs) {
  // One captured microbatch graph replayed for microbatches 0..2: what TE's graphs do.
  compare_graph_and_eager(kHost, "dist-adam", "single", /*one_graph=*/false, false, 10, 4, true);
}
TEST(TrainerHost, GraphEqualsEagerDiscreteExperts) {
  // Discrete experts are packed for compute on the first microbatch only, decided on the
  // device (skip_weight_update): a replayed microbatch graph must repack after each step.
  compare_graph_and_eager(kHost, "dist-adam", "discrete", /*one_graph=*/false, false, 10, 4, true);
}
TEST(TrainerHost, GraphEqualsEagerFsdp) {
  compare_graph_and_eager(kHost, "fsdp", "discrete", /*one_graph=*/true, false, 10, 4, true);
}

TEST(TrainerHost, FrozenHostFlagIsCaught) {
  // Negative control: weight-gradient GEMMs that overwrite on the "first" microbatch by a
  // host flag (TransformerEngine's GroupedLinear of seed 000) are right eagerly but wrong
  // in a replayed microbatch graph; the comparison above must see it in every GEMM group
  // (the embedding and norm gradients do not use GEMMs and stay right).
  const auto worst = compare_graph_and_eager(kHost, "dist-adam", "single", /*one_graph=*/false, true, 3, 4, false);
  for (NormGroup g : {NormGroup::Dense, NormGroup::Router, NormGroup::Experts, NormGroup::Head})
    EXPECT_GT(worst[static_cast<std::size_t>(g)], 1e-2) << to_string(g) << " must differ";
}

// ---- single vs discrete expert weights: bitwise

TEST(TrainerHost, SingleEqualsDiscreteDistAdam) {
  if (world_size() > 2) GTEST_SKIP() << "bitwise only where the reduction order cannot differ (<= 2 ranks)";
  case_single_equals_discrete(kHost, "dist-adam", "fp32", true);
  case_single_equals_discrete(kHost, "dist-adam", "bf16", false);
}
TEST(TrainerHost, SingleEqualsDiscreteFsdp) {
  if (world_size() > 2) GTEST_SKIP() << "bitwise only where the reduction order cannot differ (<= 2 ranks)";
  case_single_equals_discrete(kHost, "fsdp", "bf16", true);
}

// ---- --params mxfp8 (dist-adam): MXFP8 weights decoded to bf16 once per step for compute

TEST(TrainerHost, LossBelowThresholdMxfp8) { case_loss_below_threshold(kHost, "dist-adam", "single", "fp32", "mxfp8"); }
TEST(TrainerHost, LossBelowThresholdMxfp8DiscreteBf16Grads) {
  case_loss_below_threshold(kHost, "dist-adam", "discrete", "bf16", "mxfp8");
}
TEST(TrainerHost, GraphEqualsEagerMxfp8OneGraph) {
  compare_graph_and_eager(kHost, "dist-adam", "single", /*one_graph=*/true, false, 10, 4, true, "mxfp8");
}
TEST(TrainerHost, GraphEqualsEagerMxfp8SplitGraphsDiscrete) {
  // One captured microbatch graph replayed for microbatches 0..2: the MXFP8 weights must be
  // decoded again after every step, as the device flag says (seed 000).
  compare_graph_and_eager(kHost, "dist-adam", "discrete", /*one_graph=*/false, false, 10, 4, true, "mxfp8");
}
TEST(TrainerHost, SingleEqualsDiscreteMxfp8) {
  if (world_size() > 2) GTEST_SKIP() << "bitwise only where the reduction order cannot differ (<= 2 ranks)";
  case_single_equals_discrete(kHost, "dist-adam", "fp32", true, "mxfp8");
  case_single_equals_discrete(kHost, "dist-adam", "bf16", false, "mxfp8");
}
TEST(TrainerHost, Mxfp8ComputeWeightsAreCurrent) {
  case_mxfp8_compute_weights_are_current(kHost, "single", /*graph=*/true, /*one_graph=*/true);
  case_mxfp8_compute_weights_are_current(kHost, "discrete", /*graph=*/true, /*one_graph=*/false);
  case_mxfp8_compute_weights_are_current(kHost, "single", /*graph=*/true, /*one_graph=*/false);
  case_mxfp8_compute_weights_are_current(kHost, "discrete", /*graph=*/false, /*one_graph=*/true);
}

// ---- --mode fsdp --params mxfp8: one plane gathered per pass (rowwise forward, columnwise
// for the data-gradient GEMM), each decoded to bf16 on use

TEST(TrainerHost, LossBelowThresholdFsdpMxfp8) { case_loss_below_threshold(kHost, "fsdp", "single", "bf16", "mxfp8"); }
TEST(TrainerHost, LossBelowThresholdFsdpMxfp8DiscreteFp32Grads) {
  case_loss_below_threshold(kHost, "fsdp", "discrete", "fp32", "mxfp8");
}

// ---- --params nvfp4 (dist-adam): NVFP4 weights decoded to bf16 for compute

SHARDOPT_TRAINER_NVFP4_CASES(TrainerHost, kHost)
TEST(TrainerHost, Nvfp4FsdpIsAClearError) { case_quantized_fsdp_refused(kHost, "nvfp4", "no NVFP4 parameters in FSDP"); }

// ---- checkpoints: resume equals the uninterrupted run, bitwise; across expert layouts

TEST(TrainerHost, ResumeEqualsUninterruptedDistAdam) {
  case_resume_equals_uninterrupted(kHost, "dist-adam", "bf16", "single", /*graph=*/false);
  case_resume_equals_uninterrupted(kHost, "dist-adam", "bf16", "discrete", /*graph=*/true);
}
TEST(TrainerHost, ResumeEqualsUninterruptedFsdp) {
  case_resume_equals_uninterrupted(kHost, "fsdp", "bf16", "discrete", /*graph=*/false);
  case_resume_equals_uninterrupted(kHost, "fsdp", "bf16", "single", /*graph=*/true);
}
TEST(TrainerHost, ResumeEqualsUninterruptedMxfp8) {
  // dist-adam only: Fsdp refuses checkpoints of MXFP8 parameters for now.
  case_resume_equals_uninterrupted(kHost, "dist-adam", "mxfp8", "discrete", /*graph=*/false);
  case_resume_equals_uninterrupted(kHost, "dist-adam", "mxfp8", "single", /*graph=*/true);
}
TEST(TrainerHost, CheckpointSingleToDiscreteExperts) {
  case_checkpoint_across_expert_layouts(kHost, "dist-adam", "bf16", /*graph=*/true, "single", "discrete");
  case_checkpoint_across_expert_layouts(kHost, "fsdp", "bf16", /*graph=*/false, "single", "discrete");
  case_checkpoint_across_expert_layouts(kHost, "dist-adam", "mxfp8", /*graph=*/false, "single", "discrete");
  case_checkpoint_across_expert_layouts(kHost, "dist-adam", "bf16", /*graph=*/false, "discrete", "single");
}

}  // namespace
}  // namespace trainer::test
