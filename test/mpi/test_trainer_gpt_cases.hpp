// test_trainer_gpt_cases.hpp - the example trainer's GPT on text (--model gpt --task
// shakespeare) end to end, written once for the host backend under mpiexec
// (test/mpi/test_trainer_gpt.cpp) and GPUs (test/gpu/test_trainer_gpt_gpu.cpp). The data
// is the committed excerpt's token files, whose directory meson passes in
// SHARDOPT_TEXT_DATA.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "test_trainer_cases.hpp"

namespace trainer::test {

/// The tiny GPT on the excerpt: V = 68 characters, H = 32, N = 2, 2 heads, context 32, 2
/// sequences per microbatch per rank.
inline TrainOptions gpt_options(const std::string& mode, const std::string& params, int microbatches, int steps) {
  const char* dir = std::getenv("SHARDOPT_TEXT_DATA");
  if (dir == nullptr || *dir == '\0') {
    ADD_FAILURE() << "SHARDOPT_TEXT_DATA is not set (meson sets it to the excerpt's token files)";
    dir = "missing";
  }
  TrainOptions o = parse_options({"--model", "gpt", "--size", "tiny", "--task", "shakespeare", "--data", dir,
                                  "--mode", mode, "--params", params});
  o.microbatches = microbatches;
  o.steps = steps;
  o.quiet = true;
  return o;
}

/// THRESHOLD. The tiny GPT on the excerpt, 2 microbatches, AdamW peak lr 1e-2 (warm-up 6,
/// cosine to 1e-3 at step 60): the first loss is within 0.15 of ln 68 = 4.22 (uniform);
/// the loss of step 60 is below kGptTrainLoss and the validation loss (4 fixed batches per
/// rank of the held-out work) below kGptValLoss, on 1 and 2 ranks, in every mode.
inline constexpr int kGptSteps = 60;
inline constexpr double kGptTrainLoss = 2.9;
inline constexpr double kGptValLoss = 3.25;

/// Sanitizer-sized (sanitizer_cases()): kSanitizerSteps steps, and the training and
/// validation losses must fall.
inline void case_gpt_learns(shardopt::Backend b, const std::string& mode, const std::string& params, bool graph,
                            const std::string& optimizer = "adamw") {
  const bool sized = sanitizer_cases();
  const int steps = sized ? kSanitizerSteps : kGptSteps;
  TrainOptions o = gpt_options(mode, params, 2, steps);
  o.graph = graph;
  o.optimizer = optimizer;
  o.grad_dtype = mode == "fsdp" ? "bf16" : "fp32";
  Trainer t(o, make_comm(b));
  const std::string what = mode + " --params " + params + " --optimizer " + optimizer + (graph ? " graph" : " eager") + " on " +
                           std::to_string(world_size()) + " rank(s)";
  EXPECT_EQ(t.spec().config().vocab, 68) << "the excerpt's vocabulary";
  const double val0 = t.evaluate();
  EXPECT_NEAR(val0, std::log(68.0), 0.15) << what;
  double first = 0, last = 0;
  for (int s = 1; s <= steps; ++s) {
    t.step();
    if (s == 1) first = t.stats().loss;
  }
  last = t.stats().loss;
  const double val = t.evaluate();
  EXPECT_NEAR(first, std::log(68.0), 0.15) << what;
  EXPECT_LT(last, sized ? first : kGptTrainLoss) << what << " after " << steps << " steps";
  EXPECT_LT(val, sized ? val0 : kGptValLoss) << what << " after " << steps << " steps";
  if (t.comm().rank() == 0)
    std::printf("[gpt] %s: loss %.4f -> %.4f, val %.4f -> %.4f\n", what.c_str(), first, last, val0, val);
}

/// Graph replay equals eager execution: the same losses of every microbatch and step and
/// the same parameter bytes after 6 steps of 3 microbatches, bitwise.
inline void case_gpt_graph_equals_eager(shardopt::Backend b, const std::string& mode, const std::string& params) {
  TrainOptions o = gpt_options(mode, params, 3, 20);
  o.graph = false;
  Trainer eager(o, make_comm(b));
  o.graph = true;
  Trainer graph(o, make_comm(b));
  const RunResult e = train_more(eager, 6), g = train_more(graph, 6);
  expect_same_run(e, g, eager, "gpt " + mode + " --params " + params + ": graph vs eager");
}

/// Resume equals the uninterrupted run, bitwise: 6 steps, save, 6 more; a fresh trainer
/// that loads the checkpoint trains the same 6 (losses of every microbatch, step counts,
/// parameter bytes): the batches of a step are a function of (seed, rank, step,
/// microbatch), and the step comes back with the optimizer.
inline void case_gpt_resume_equals_uninterrupted(shardopt::Backend b, const std::string& mode,
                                                 const std::string& params, bool graph,
                                                 const std::string& optimizer = "adamw") {
  TrainOptions o = gpt_options(mode, params, 2, 20);
  o.graph = graph;
  o.optimizer = optimizer;
  SharedTempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp / "step-00006";
  Trainer a(o, make_comm(b));
  for (int s = 0; s < 6; ++s) a.step();
  a.save(dir);
  const RunResult reference = train_more(a, 6);
  Trainer fresh(o, make_comm(b));
  const shardopt::CheckpointInfo info = fresh.load(dir);
  EXPECT_EQ(info.user.at("trainer.model"), "gpt");
  EXPECT_EQ(info.user.at("trainer.task"), "shakespeare");
  EXPECT_EQ(info.user.at("trainer.optimizer"), optimizer);
  expect_same_run(reference, train_more(fresh, 6), a,
                  "gpt " + mode + " --params " + params + " --optimizer " + optimizer + (graph ? " graph" : " eager") +
                      ": resumed");
}

/// Evaluation touches nothing of training: a run that evaluates after every second step
/// trains bitwise like one that does not (losses, parameters), and two evaluations of the
/// same weights give the same loss (fixed batches).
inline void case_gpt_evaluation_changes_nothing(shardopt::Backend b, const std::string& mode, bool graph) {
  TrainOptions o = gpt_options(mode, "bf16", 2, 20);
  o.graph = graph;
  Trainer plain(o, make_comm(b)), evaluated(o, make_comm(b));
  RunResult p, e;
  for (int k = 0; k < 4; ++k) {
    const RunResult pp = train_more(plain, 2), ee = train_more(evaluated, 2);
    const double v1 = evaluated.evaluate(), v2 = evaluated.evaluate();
    EXPECT_EQ(v1, v2) << "the evaluation batches are fixed";
    EXPECT_TRUE(std::isfinite(v1));
    p.loss.insert(p.loss.end(), pp.loss.begin(), pp.loss.end());
    e.loss.insert(e.loss.end(), ee.loss.begin(), ee.loss.end());
    p.mb_loss.insert(p.mb_loss.end(), pp.mb_loss.begin(), pp.mb_loss.end());
    e.mb_loss.insert(e.mb_loss.end(), ee.mb_loss.begin(), ee.mb_loss.end());
    p.step.insert(p.step.end(), pp.step.begin(), pp.step.end());
    e.step.insert(e.step.end(), ee.step.begin(), ee.step.end());
    p.params = pp.params;
    e.params = ee.params;
  }
  expect_same_run(p, e, plain, "gpt " + mode + (graph ? " graph" : " eager") + ": with evaluations");
}

/// The generated sample: `n` characters of the vocabulary, the same on every rank and for
/// the same seed, another text for another seed.
inline void case_gpt_sample(shardopt::Backend b, const std::string& mode) {
  TrainOptions o = gpt_options(mode, "bf16", 2, 30);
  Trainer t(o, make_comm(b));
  for (int s = 0; s < 30; ++s) t.step();
  const std::string a = t.sample(40, 7), again = t.sample(40, 7), other = t.sample(40, 8);
  EXPECT_EQ(a.size(), 40u) << "the excerpt's characters are ASCII";
  EXPECT_EQ(a, again);
  EXPECT_NE(a, other);
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : a) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  for (std::uint64_t x : t.comm().all_gather_value(h)) EXPECT_EQ(x, h) << "every rank generates the same text";
}

}  // namespace trainer::test
