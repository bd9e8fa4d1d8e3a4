// The example trainer's GPT (examples/trainer/gpt_model.cpp, gpt_host_ops.hpp) and its
// text data (text_data.*): the new ops' backward against central finite differences in
// double precision, the whole GPT's gradients likewise, causality against a re-run with
// later tokens changed, the mixed-precision host model against the double one, the
// memory-mapped token files and the deterministic batch windows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <shardopt/fused_adam.hpp>
#include <shardopt/microbatch.hpp>

#include "gpt_host_ops.hpp"
#include "model.hpp"
#include "model_spec.hpp"
#include "text_data.hpp"
#include "trainer_check_util.hpp"
#include "weights.hpp"

namespace trainer {
namespace {

using namespace check;

TEST(GptOps, GeluMatchesTheErfFormulaAndItsBackwardFiniteDifferences) {
  // Oracle: 0.5 x (1 + erf(x / sqrt 2)) written here.
  for (double x : {-3.0, -0.5, 0.0, 0.7, 2.5})
    EXPECT_NEAR(host::gelu(x), 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))), 1e-15);
  EXPECT_NEAR(host::gelu(1.3f), 0.5 * 1.3 * (1.0 + std::erf(1.3 / std::sqrt(2.0))), 1e-6);
  auto u = random_vector(11, 1, 4.0), r = random_vector(11, 2);
  auto loss = [&] {
    std::vector<double> a(11);
    host::gelu_forward(u.data(), a.data(), 11);
    return dot(a, r);
  };
  std::vector<double> du(11);
  host::gelu_backward(r.data(), u.data(), du.data(), 11);
  for (std::size_t i = 0; i < u.size(); ++i) expect_grad(du[i], central(u, i, loss), "du " + std::to_string(i));
}

TEST(GptOps, CausalSoftmaxIsMaskedAndItsBackwardMatchesFiniteDifferences) {
  const std::int64_t blocks = 3, S = 5;
  auto x = random_vector(blocks * S * S, 3, 3.0), r = random_vector(blocks * S * S, 4);
  auto forward = [&](std::vector<double>& p) {
    std::vector<double> low(p.size());
    host::causal_softmax_forward(x.data(), p.data(), low.data(), blocks, S);
  };
  std::vector<double> p(x.size());
  forward(p);
  for (std::int64_t b = 0; b < blocks; ++b)
    for (std::int64_t i = 0; i < S; ++i) {
      // Oracle: softmax over j <= i computed here; zeros above the diagonal.
      double m = -1e300, s = 0;
      for (std::int64_t j = 0; j <= i; ++j) m = std::max(m, x[(b * S + i) * S + j]);
      for (std::int64_t j = 0; j <= i; ++j) s += std::exp(x[(b * S + i) * S + j] - m);
      for (std::int64_t j = 0; j < S; ++j) {
        const double want = j <= i ? std::exp(x[(b * S + i) * S + j] - m) / s : 0.0;
        EXPECT_NEAR(p[(b * S + i) * S + j], want, 1e-14);
      }
    }
  auto loss = [&] {
    std::vector<double> q(x.size());
    forward(q);
    return dot(q, r);
  };
  std::vector<double> dx(x.size());
  host::causal_softmax_backward(r.data(), p.data(), dx.data(), blocks, S);
  for (std::size_t i = 0; i < x.size(); ++i) expect_grad(dx[i], central(x, i, loss), "dscore " + std::to_string(i));
}

TEST(GptOps, PositionEmbeddingBackwardMatchesFiniteDifferences) {
  const std::int64_t T = 12, S = 4, H = 3;
  auto table = random_vector(S * H, 5), r = random_vector(T * H, 6), h0 = random_vector(T * H, 7);
  auto loss = [&] {
    std::vector<double> h = h0;
    host::pos_embed_forward(table.data(), h.data(), T, S, H);
    return dot(h, r);
  };
  std::vector<double> dtable(S * H, 0.5);
  host::pos_embed_backward(r.data(), dtable.data(), T, S, H);
  for (std::size_t i = 0; i < table.size(); ++i)
    expect_grad(dtable[i] - 0.5, central(table, i, loss), "dtable " + std::to_string(i));
}

// ---------------------------------------------------------------- the whole GPT

ModelConfig gpt_check_config() {
  ModelConfig c;
  c.gpt = true;
  c.vocab = 11, c.hidden = 8, c.layers = 2, c.mlp = 12, c.heads = 2, c.context = 5, c.tokens = 10;
  return c;
}
std::vector<std::int32_t> gpt_tokens() { return {4, 10, 4, 0, 7, 3, 4, 3, 10, 9}; }
std::vector<std::int32_t> gpt_targets() { return {1, 5, 1, 10, 3, 0, 2, 8, 5, 6}; }

/// Sets every parameter to a random value of the size the trained model has (the init of
/// 0.02 makes attention almost uniform, which would check little).
void randomize(ArrayWeights& w, const ModelSpec& spec, double scale) {
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor p = w.param(i);
    const auto v = random_vector(static_cast<std::size_t>(p.numel), 100 + static_cast<std::uint32_t>(i), scale);
    for (std::int64_t j = 0; j < p.numel; ++j)
      dptr(p)[j] = spec.params()[static_cast<std::size_t>(i)].kind == ParamKind::Norm ? 1.0 + 0.5 * v[static_cast<std::size_t>(j)]
                                                                                     : v[static_cast<std::size_t>(j)];
  }
}

TEST(GptModel, GradientsMatchFiniteDifferences) {
  auto ops = make_host_ops(Precision::Double);
  ModelSpec spec(gpt_check_config(), false);
  ASSERT_EQ(spec.num_params(), 2 + 6 * 2 + 2);
  ArrayWeights w(*ops, spec);
  randomize(w, spec, 0.6);
  expect_model_gradients_match_finite_differences(spec, *ops, w, gpt_tokens(), gpt_targets(), 9, 120);
}

TEST(GptModel, AttentionIsCausalAndSequencesAreIndependent) {
  // Oracle: the definition. Changing the token at position p of sequence 1 changes no
  // logit before p in it and no logit of sequence 0; it changes the logits from p on.
  auto ops = make_host_ops(Precision::Double);
  const ModelConfig c = gpt_check_config();
  ModelSpec spec(c, false);
  ArrayWeights w(*ops, spec);
  randomize(w, spec, 0.6);
  ModelOptions mo;
  mo.generate_batch = false;
  Model model(spec, *ops, mo);
  auto logits = [&](const std::vector<std::int32_t>& tokens) {
    model.set_batch(tokens, gpt_targets());
    model.forward(w, ops->stream());
    return std::vector<double>(dptr(model.logits()), dptr(model.logits()) + c.tokens * c.vocab);
  };
  const auto base = logits(gpt_tokens());
  const std::int64_t p = 2;  // position 2 of sequence 1
  auto changed = gpt_tokens();
  changed[static_cast<std::size_t>(c.context + p)] = 1;
  const auto other = logits(changed);
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    double diff = 0;
    for (std::int64_t v = 0; v < c.vocab; ++v)
      diff = std::max(diff, std::fabs(base[static_cast<std::size_t>(t * c.vocab + v)] - other[static_cast<std::size_t>(t * c.vocab + v)]));
    if (t < c.context + p)
      EXPECT_EQ(diff, 0.0) << "position " << t << " sees a later token or another sequence";
    else
      EXPECT_GT(diff, 1e-6) << "position " << t << " does not see position " << c.context + p;
  }
}

TEST(GptModel, MixedPrecisionHostModelTracksTheDoubleModel) {
  auto dops = make_host_ops(Precision::Double);
  auto mops = make_host_ops(Precision::Mixed);
  ModelSpec spec(gpt_check_config(), false);
  ArrayWeights wd(*dops, spec), wm(*mops, spec);
  randomize(wd, spec, 0.6);
  for (int i = 0; i < spec.num_params(); ++i) {  // the mixed model's bf16 values, in both
    const Tensor d = wd.param(i), m = wm.param(i);
    for (std::int64_t j = 0; j < d.numel; ++j) {
      m.as<std::uint16_t>()[j] = math::to_bf16(static_cast<float>(dptr(d)[j]));
      dptr(d)[j] = math::from_bf16(m.as<std::uint16_t>()[j]);
    }
  }
  expect_mixed_tracks_double(spec, *dops, wd, *mops, wm, gpt_tokens(), gpt_targets());
}

TEST(GptModel, EvalForwardWritesItsOwnSlotAndNoGradient) {
  auto ops = make_host_ops(Precision::Double);
  ModelSpec spec(gpt_check_config(), false);
  ArrayWeights w(*ops, spec);
  randomize(w, spec, 0.6);
  ModelOptions mo;
  mo.generate_batch = false;
  Model model(spec, *ops, mo);
  model.set_batch(gpt_tokens(), gpt_targets());
  model.forward(w, ops->stream());
  const double train_loss = dptr(model.loss_slots())[0];
  dptr(model.loss_slots())[0] = -7.0;
  model.eval_forward(w, ops->stream());
  EXPECT_EQ(dptr(model.eval_loss())[0], train_loss);  // the same batch and weights: the same loss
  EXPECT_EQ(dptr(model.loss_slots())[0], -7.0);      // the training slot is untouched
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor g = w.grad(i);
    for (std::int64_t j = 0; j < g.numel; ++j) ASSERT_EQ(dptr(g)[j], 0.0) << spec.params()[static_cast<std::size_t>(i)].name;
  }
}

TEST(GptConfig, SizesAndOptions) {
  const TrainOptions o = parse_options({"--model", "gpt", "--size", "baby", "--task", "shakespeare", "--data", "d",
                                        "--eval-every", "50", "--eval-batches", "8", "--sample", "300"});
  EXPECT_TRUE(o.model.gpt);
  EXPECT_EQ(o.model.layers, 6);
  EXPECT_EQ(o.model.heads, 6);
  EXPECT_EQ(o.model.hidden, 384);
  EXPECT_EQ(o.model.context, 256);
  EXPECT_EQ(o.model.tokens, 64 * 256);
  EXPECT_EQ(o.task, "shakespeare");
  EXPECT_EQ(o.data_dir, "d");
  EXPECT_EQ(o.eval_every, 50);
  EXPECT_EQ(o.eval_batches, 8);
  EXPECT_EQ(o.sample_chars, 300);
  // nanoGPT's baby GPT (bias off, 65 characters) reports 10,646,784 parameters: its count
  // leaves out the position embedding (256 x 384) and its head is tied; ours has its own
  // head (65 x 384). RMSNorm has LayerNorm's weight count.
  ModelConfig c = o.model;
  c.vocab = 65;
  EXPECT_EQ(c.param_count(), 10646784 + 256 * 384 + 65 * 384);
  EXPECT_THROW(parse_options({"--model", "gpt", "--size", "1b"}), std::invalid_argument);
  EXPECT_THROW(parse_options({"--model", "gpt", "--heads", "5"}), std::invalid_argument);   // 32 % 5
  EXPECT_THROW(parse_options({"--model", "gpt", "--context", "48"}), std::invalid_argument); // 64 % 48
  EXPECT_THROW(parse_options({"--task", "poems"}), std::invalid_argument);
  EXPECT_FALSE(parse_options({}).model.gpt);
}

// ---------------------------------------------------------------- token files and windows

class TextFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("trainer_text_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    for (int i = 0; i < 1000; ++i) train_.push_back(static_cast<std::uint8_t>((i * 7 + i / 13) % 5));
    for (int i = 0; i < 300; ++i) val_.push_back(static_cast<std::uint8_t>(i % 5));
    write("train.bin", std::string(train_.begin(), train_.end()));
    write("val.bin", std::string(val_.begin(), val_.end()));
    write("vocab.json", "{\"chars\": [\"\\n\", \" \", \"\\\"\", \"a\", \"\\u00e6\"]}");
    write("manifest.json", "{\n \"format\": 1,\n \"dtype\": \"uint8\",\n \"vocab_size\": 5,\n \"train\": {\n  \"file\": "
                           "\"train.bin\",\n  \"tokens\": 1000\n },\n \"val\": {\n  \"file\": \"val.bin\",\n  \"tokens\": 300\n }\n}\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& bytes) {
    std::ofstream f(dir_ / name, std::ios::binary);
    f << bytes;
  }
  std::filesystem::path dir_;
  std::vector<std::uint8_t> train_, val_;
};

TEST_F(TextFiles, ManifestVocabularyAndMappedTokens) {
  const TextManifest m = read_text_manifest(dir_.string());
  EXPECT_EQ(m.vocab_size, 5);
  EXPECT_EQ(m.train_tokens, 1000);
  EXPECT_EQ(m.val_tokens, 300);
  ASSERT_EQ(m.chars.size(), 5u);
  EXPECT_EQ(m.chars[0], "\n");
  EXPECT_EQ(m.chars[2], "\"");
  EXPECT_EQ(m.chars[4], "\xc3\xa6");  // U+00E6 in UTF-8
  EXPECT_EQ(decode_text(m.chars, {3, 1, 0, 4}), "a \n\xc3\xa6");
  MappedTokens t((dir_ / "train.bin").string(), m.train_tokens);
  ASSERT_EQ(t.size(), 1000);
  EXPECT_TRUE(std::equal(train_.begin(), train_.end(), t.data()));
  EXPECT_THROW(MappedTokens((dir_ / "val.bin").string(), 301), std::runtime_error);  // not the manifest's count
  EXPECT_THROW(read_text_manifest((dir_ / "missing").string()), std::runtime_error);
}

TEST_F(TextFiles, BatchWindowsAreAFunctionOfSeedStepRankAndMicrobatch) {
  MappedTokens t((dir_ / "train.bin").string(), 1000);
  auto ops = make_host_ops(Precision::Mixed);
  shardopt::StepScalars scalars;
  shardopt::MicrobatchState mb;
  const std::int64_t seqs = 4, S = 16;
  Buffer tok = ops->alloc(Elem::i32, seqs * S), tgt = ops->alloc(Elem::i32, seqs * S);
  auto batch = [&](std::uint64_t seed, int rank, std::int64_t step, int index) {
    TextBatchArgs a;
    a.scalars = &scalars;
    a.microbatch = &mb;
    a.seed = seed, a.rank = rank, a.seqs = seqs, a.context = S, a.data = t.data(), a.data_tokens = t.size();
    scalars.step = step;  // read when the op runs (the device value), never at enqueue
    mb.index = index;
    ops->text_batch(a, tok, tgt, ops->stream());
    ops->synchronize();
    std::vector<std::int32_t> out(tok.as<std::int32_t>(), tok.as<std::int32_t>() + seqs * S);
    // Every window is a run of the file, the targets the same run one token later.
    for (std::int64_t j = 0; j < seqs; ++j) {
      bool found = false;
      for (std::int64_t start = 0; start + S < 1000 && !found; ++start) {
        bool same = true;
        for (std::int64_t i = 0; i < S && same; ++i)
          same = out[static_cast<std::size_t>(j * S + i)] == train_[static_cast<std::size_t>(start + i)] &&
                 tgt.as<std::int32_t>()[j * S + i] == train_[static_cast<std::size_t>(start + i + 1)];
        found = same;
      }
      EXPECT_TRUE(found) << "window " << j << " is not a run of the file with its next tokens";
    }
    return out;
  };
  const auto a = batch(1, 0, 5, 1);
  EXPECT_EQ(batch(1, 0, 5, 1), a);  // the same inputs: the same batch (a resumed run's)
  std::set<std::vector<std::int32_t>> distinct{a, batch(2, 0, 5, 1), batch(1, 1, 5, 1), batch(1, 0, 6, 1),
                                               batch(1, 0, 5, 0)};
  EXPECT_EQ(distinct.size(), 5u) << "seed, rank, step and microbatch each change the batch";
  // Windows never read past the end: the last start is data_tokens - context - 1.
  TextBatchArgs bad;
  bad.seqs = 1, bad.context = 1000, bad.data = t.data(), bad.data_tokens = t.size();
  Buffer one = ops->alloc(Elem::i32, 1000), two = ops->alloc(Elem::i32, 1000);
  EXPECT_THROW(ops->text_batch(bad, one, two, ops->stream()), std::invalid_argument);
}

TEST(GptData, WindowStartsMatchThePeersGoldenValues) {
  // The same golden values as test/python/test_gpt_peer_data.py asserts of the PyTorch
  // peer's window_start (bench/peers/gpt_peer.py): both read the same batches.
  EXPECT_EQ(math::window_start(1234, 0, 0, 0, 0, 1000), 928);
  EXPECT_EQ(math::window_start(1234, 1, 5, 1, 3, 4568876), 488030);
  EXPECT_EQ(math::window_start(0xE7A15EEDull ^ 1234, 0, 2, 0, 7, 487893), 354179);
  EXPECT_EQ(math::window_start(7, 3, 123456, 2, 63, 97), 31);
}

}  // namespace
}  // namespace trainer
