// The example trainer's GPT on the committed Shakespeare excerpt on GPUs, one rank per GPU
// (test/gpu/run_mpi.sh on 1 and 2 GPUs; exit 77 with too few): the host suite's cases
// (test/mpi/test_trainer_gpt_cases.hpp) on the CUDA backend: the attention's cuBLAS
// strided-batched GEMMs and softmax kernel, NCCL, CUDA graphs.
#include "../mpi/test_trainer_gpt_cases.hpp"

namespace trainer::test {
namespace {

constexpr shardopt::Backend kCuda = shardopt::Backend::Cuda;

TEST(GptGpu, LearnsDistAdam) { case_gpt_learns(kCuda, "dist-adam", "bf16", true); }
TEST(GptGpu, LearnsFsdp) { case_gpt_learns(kCuda, "fsdp", "bf16", true); }
TEST(GptGpu, LearnsMxfp8) { case_gpt_learns(kCuda, "dist-adam", "mxfp8", true); }
TEST(GptGpu, LearnsNvfp4Eager) { case_gpt_learns(kCuda, "dist-adam", "nvfp4", false); }
TEST(GptGpu, GraphEqualsEagerDistAdam) { case_gpt_graph_equals_eager(kCuda, "dist-adam", "bf16"); }
TEST(GptGpu, GraphEqualsEagerFsdp) { case_gpt_graph_equals_eager(kCuda, "fsdp", "bf16"); }
TEST(GptGpu, ResumeEqualsUninterruptedDistAdam) { case_gpt_resume_equals_uninterrupted(kCuda, "dist-adam", "bf16", true); }
TEST(GptGpu, ResumeEqualsUninterruptedFsdp) { case_gpt_resume_equals_uninterrupted(kCuda, "fsdp", "bf16", true); }
TEST(GptGpu, EvaluationChangesNothingFsdp) { case_gpt_evaluation_changes_nothing(kCuda, "fsdp", true); }
TEST(GptGpu, Sample) { case_gpt_sample(kCuda, "fsdp"); }

}  // namespace
}  // namespace trainer::test
