// The example trainer with --optimizer muon (issue 34): the GPT on the committed
// Shakespeare excerpt, host backend under mpiexec (1 and 2 ranks): the parameters go to
// the documented groups, the loss falls (DistributedAdam with its captured graph, Fsdp),
// and resume from a checkpoint equals the uninterrupted run bitwise (Muon's momentum is
// saved). The command-line resume of the MoE model is meson test trainer_resume_cli_muon_n2.
#include "test_trainer_gpt_cases.hpp"

namespace trainer::test {
namespace {

constexpr shardopt::Backend kHost = shardopt::Backend::Host;

// Muon for every block matrix (attention qkv / out, MLP up / down) and AdamW for the
// embeddings, head and norms; the optimizer runs one Muon group, and --optimizer adamw
// keeps every parameter out of it.
TEST(GptMuonHost, GroupsAsDocumented) {
  TrainOptions o = gpt_options("dist-adam", "bf16", 1, 2);
  o.optimizer = "muon";
  Trainer t(o, make_comm(kHost));
  const auto& specs = t.dist_adam()->layout().specs();
  int muon = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ParamInfo& p = t.spec().params()[i];
    const bool matrix = p.kind == ParamKind::Qkv || p.kind == ParamKind::AttnOut || p.kind == ParamKind::DenseUp ||
                        p.kind == ParamKind::DenseDown;
    EXPECT_EQ(specs[i].group == "muon", matrix) << specs[i].name << " is in group " << specs[i].group;
    muon += specs[i].group == "muon" ? 1 : 0;
  }
  EXPECT_EQ(muon, 4 * t.spec().config().layers);
  o.optimizer = "adamw";
  Trainer a(o, make_comm(kHost));
  for (const auto& s : a.dist_adam()->layout().specs()) EXPECT_NE(s.group, "muon") << s.name;
}

TEST(GptMuonHost, LearnsDistAdam) { case_gpt_learns(kHost, "dist-adam", "bf16", true, "muon"); }
TEST(GptMuonHost, LearnsFsdp) { case_gpt_learns(kHost, "fsdp", "bf16", true, "muon"); }

TEST(GptMuonHost, ResumeEqualsUninterruptedDistAdam) {
  case_gpt_resume_equals_uninterrupted(kHost, "dist-adam", "bf16", true, "muon");
}
TEST(GptMuonHost, ResumeEqualsUninterruptedFsdpEager) {
  case_gpt_resume_equals_uninterrupted(kHost, "fsdp", "bf16", false, "muon");
}

// The run with Muon is another run than AdamW's (the flag reaches the optimizer), and
// --params mxfp8 / nvfp4 with --optimizer muon is refused by name before any work.
TEST(GptMuonHost, DiffersFromAdamWAndRefusesQuantizedParams) {
  TrainOptions o = gpt_options("dist-adam", "bf16", 1, 3);
  Trainer adamw(o, make_comm(kHost));
  o.optimizer = "muon";
  Trainer muon(o, make_comm(kHost));
  for (int s = 0; s < 3; ++s) {
    adamw.step();
    muon.step();
  }
  EXPECT_NE(adamw.stats().loss, muon.stats().loss);
  for (const char* params : {"mxfp8", "nvfp4"}) {
    TrainOptions q = gpt_options("dist-adam", params, 1, 3);
    q.optimizer = "muon";
    try {
      Trainer t(q, make_comm(kHost));
      ADD_FAILURE() << "--optimizer muon --params " << params << " was not refused";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("use --params bf16 with --optimizer muon"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace trainer::test
