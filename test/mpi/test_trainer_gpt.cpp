// The example trainer's GPT on the committed Shakespeare excerpt, host backend under
// mpiexec (1 and 2 ranks in CI): it learns in every mode, graph replay equals eager,
// resume equals the uninterrupted run, evaluation changes nothing, the sample.
#include "test_trainer_gpt_cases.hpp"

namespace trainer::test {
namespace {

constexpr shardopt::Backend kHost = shardopt::Backend::Host;

TEST(GptHost, LearnsDistAdam) { case_gpt_learns(kHost, "dist-adam", "bf16", true); }
TEST(GptHost, LearnsDistAdamEager) { case_gpt_learns(kHost, "dist-adam", "bf16", false); }
TEST(GptHost, LearnsFsdp) { case_gpt_learns(kHost, "fsdp", "bf16", true); }
TEST(GptHost, LearnsMxfp8) { case_gpt_learns(kHost, "dist-adam", "mxfp8", true); }
TEST(GptHost, LearnsNvfp4) { case_gpt_learns(kHost, "dist-adam", "nvfp4", true); }
TEST(GptHost, LearnsFsdpMxfp8) { case_gpt_learns(kHost, "fsdp", "mxfp8", true); }

TEST(GptHost, GraphEqualsEagerDistAdam) { case_gpt_graph_equals_eager(kHost, "dist-adam", "bf16"); }
TEST(GptHost, GraphEqualsEagerFsdp) { case_gpt_graph_equals_eager(kHost, "fsdp", "bf16"); }
TEST(GptHost, GraphEqualsEagerMxfp8) { case_gpt_graph_equals_eager(kHost, "dist-adam", "mxfp8"); }

TEST(GptHost, ResumeEqualsUninterruptedDistAdam) { case_gpt_resume_equals_uninterrupted(kHost, "dist-adam", "bf16", true); }
TEST(GptHost, ResumeEqualsUninterruptedFsdpEager) { case_gpt_resume_equals_uninterrupted(kHost, "fsdp", "bf16", false); }
TEST(GptHost, ResumeEqualsUninterruptedNvfp4) { case_gpt_resume_equals_uninterrupted(kHost, "dist-adam", "nvfp4", true); }

TEST(GptHost, EvaluationChangesNothingDistAdam) { case_gpt_evaluation_changes_nothing(kHost, "dist-adam", true); }
TEST(GptHost, EvaluationChangesNothingFsdp) { case_gpt_evaluation_changes_nothing(kHost, "fsdp", true); }
TEST(GptHost, EvaluationChangesNothingFsdpEager) { case_gpt_evaluation_changes_nothing(kHost, "fsdp", false); }

TEST(GptHost, Sample) { case_gpt_sample(kHost, "fsdp"); }

}  // namespace
}  // namespace trainer::test
