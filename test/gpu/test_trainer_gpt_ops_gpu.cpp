// The GPT's CUDA ops (examples/trainer/cuda_*.cu: text windows, position embedding,
// GELU, causal softmax; attention through cuBLAS strided-batched GEMMs) against the host
// ops (mixed precision; those are checked against finite differences in
// test/unit/test_trainer_gpt.cpp): bitwise where both compute the same fp32 expression in
// the same order, within one bf16 ulp where a library erf/exp or a reduction order
// differs; then a whole GPT microbatch on the GPU against the host model, and its
// determinism. Exits 77 (skipped) without a GPU (test/common/gpu_main.cpp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <shardopt/fused_adam.hpp>
#include <shardopt/microbatch.hpp>

#include "model.hpp"
#include "model_spec.hpp"
#include "op_math.hpp"
#include "ops.hpp"
#include "trainer_ops_pair.hpp"
#include "weights.hpp"

namespace trainer {
namespace {

using u16 = std::uint16_t;
using i32 = std::int32_t;

/// The CUDA and host ops of the GPT's tests (trainer_ops_pair.hpp).
class GptOpsPair : public OpsPair {};

void near_bf16(const std::vector<u16>& a, const std::vector<u16>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = math::from_bf16(a[i]), y = math::from_bf16(b[i]);
    ASSERT_NEAR(x, y, 1e-30 + std::ldexp(std::fabs(y), -7)) << what << " element " << i;  // one bf16 ulp
  }
}

TEST_F(GptOpsPair, TextWindowsAreBitwiseEqualAndReadTheDeviceStep) {
  std::vector<std::uint8_t> text(5000);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<std::uint8_t>((i * 31 + i / 7) % 67);
  Twin data = from(Elem::u8, text);
  shardopt::StepScalars sc{};
  sc.step = 17;
  shardopt::MicrobatchState mb{};
  mb.index = 1;
  std::vector<std::uint8_t> sbytes(sizeof sc), mbytes(sizeof mb);
  std::memcpy(sbytes.data(), &sc, sizeof sc);
  std::memcpy(mbytes.data(), &mb, sizeof mb);
  Twin s = from(Elem::u8, sbytes), m = from(Elem::u8, mbytes);
  const std::int64_t seqs = 9, S = 100;
  Twin tok = make(Elem::i32, seqs * S), tgt = make(Elem::i32, seqs * S);
  TextBatchArgs a;
  a.seed = 5, a.rank = 1, a.seqs = seqs, a.context = S, a.data_tokens = 5000;
  a.data = data.g.as<std::uint8_t>();
  a.scalars = s.g.as<shardopt::StepScalars>();
  a.microbatch = m.g.as<shardopt::MicrobatchState>();
  gpu->text_batch(a, tok.g, tgt.g, gpu->stream());
  a.data = data.c.as<std::uint8_t>();
  a.scalars = s.c.as<shardopt::StepScalars>();
  a.microbatch = m.c.as<shardopt::MicrobatchState>();
  cpu->text_batch(a, tok.c, tgt.c, cpu->stream());
  EXPECT_EQ(rg<i32>(tok), rc<i32>(tok));
  EXPECT_EQ(rg<i32>(tgt), rc<i32>(tgt));
}

TEST_F(GptOpsPair, PositionEmbeddingIsBitwiseEqual) {
  const std::int64_t S = 37, B = 5, T = S * B, H = 48;
  std::vector<u16> table;
  for (float x : randf(S * H, 1)) table.push_back(math::to_bf16(x));
  Twin tab = from(Elem::bf16, table), h = from(Elem::f32, randf(T * H, 2)), dh = from(Elem::f32, randf(T * H, 3));
  Twin dtab = from(Elem::f32, randf(S * H, 4)), dtab16 = from(Elem::bf16, table);
  gpu->pos_embed_forward(tab.g, h.g, T, S, H, gpu->stream());
  cpu->pos_embed_forward(tab.c, h.c, T, S, H, cpu->stream());
  EXPECT_EQ(rg<float>(h), rc<float>(h));
  gpu->pos_embed_backward(dh.g, dtab.g, T, S, H, gpu->stream());
  cpu->pos_embed_backward(dh.c, dtab.c, T, S, H, cpu->stream());
  EXPECT_EQ(rg<float>(dtab), rc<float>(dtab));
  gpu->pos_embed_backward(dh.g, dtab16.g, T, S, H, gpu->stream());
  cpu->pos_embed_backward(dh.c, dtab16.c, T, S, H, cpu->stream());
  EXPECT_EQ(rg<u16>(dtab16), rc<u16>(dtab16));
}

TEST_F(GptOpsPair, GeluWithinOneBf16Ulp) {
  const std::int64_t n = 10007;
  Twin u = from(Elem::f32, randf(n, 5, 3.0f)), da = from(Elem::f32, randf(n, 6));
  Twin a = make(Elem::bf16, n), du = make(Elem::bf16, n);
  gpu->gelu_forward(u.g, a.g, n, gpu->stream());
  cpu->gelu_forward(u.c, a.c, n, cpu->stream());
  near_bf16(rg<u16>(a), rc<u16>(a), "gelu");
  gpu->gelu_backward(da.g, u.g, du.g, n, gpu->stream());
  cpu->gelu_backward(da.c, u.c, du.c, n, cpu->stream());
  near_bf16(rg<u16>(du), rc<u16>(du), "gelu backward");
}

TEST_F(GptOpsPair, CausalSoftmaxMatches) {
  for (std::int64_t S : {37, 300}) {  // under and over one block of threads per row
    const std::int64_t blocks = 6, n = blocks * S * S;
    Twin x = from(Elem::f32, randf(n, 7, 4.0f)), dp = from(Elem::f32, randf(n, 8));
    Twin p = make(Elem::f32, n), pl = make(Elem::bf16, n), ds = make(Elem::bf16, n);
    gpu->causal_softmax_forward(x.g, p.g, pl.g, blocks, S, gpu->stream());
    cpu->causal_softmax_forward(x.c, p.c, pl.c, blocks, S, cpu->stream());
    const auto pg = rg<float>(p), pc = rc<float>(p);
    expect_close(pg, pc, 1e-5, 1e-7, "probs");
    for (std::int64_t r = 0; r < blocks * S; ++r)
      for (std::int64_t j = r % S + 1; j < S; ++j) ASSERT_EQ(pg[static_cast<std::size_t>(r * S + j)], 0.0f) << "masked";
    near_bf16(rg<u16>(pl), rc<u16>(pl), "probs bf16");
    gpu->causal_softmax_backward(dp.g, p.g, ds.g, blocks, S, gpu->stream());
    cpu->causal_softmax_backward(dp.c, p.c, ds.c, blocks, S, cpu->stream());
    const auto dg = rg<u16>(ds), dc = rc<u16>(ds);
    for (std::size_t i = 0; i < dg.size(); ++i) {
      const double a = math::from_bf16(dg[i]), b = math::from_bf16(dc[i]);
      // Another summation order of the row's dot: within a bf16 ulp plus 1e-5 of p's scale.
      ASSERT_NEAR(a, b, std::ldexp(std::fabs(b), -7) + 1e-5 * std::fabs(math::from_bf16(rc<u16>(pl)[i])) + 1e-7)
          << "dscores element " << i << " (S = " << S << ")";
    }
  }
}

ModelConfig gpt_config() {
  ModelConfig c;
  c.gpt = true;
  c.vocab = 67, c.hidden = 64, c.layers = 2, c.mlp = 256, c.heads = 4, c.context = 48, c.tokens = 3 * 48;
  return c;
}

TEST(GptGpu, WholeMicrobatchMatchesTheHostModelAndIsDeterministic) {
  auto gpu = make_cuda_ops();
  auto cpu = make_host_ops(Precision::Mixed);
  const ModelConfig c = gpt_config();
  ModelSpec spec(c, false);
  ArrayWeights wg(*gpu, spec), wc(*cpu, spec);  // the same initial values (ModelSpec::init_value)
  ModelOptions mo;
  mo.generate_batch = false;
  Model mg(spec, *gpu, mo), mc(spec, *cpu, mo);
  std::vector<i32> tokens, targets;
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    tokens.push_back(static_cast<i32>((t * 13 + 5) % c.vocab));
    targets.push_back(static_cast<i32>((t * 13 + 18) % c.vocab));
  }
  mg.set_batch(tokens, targets);
  mc.set_batch(tokens, targets);
  mg.microbatch(wg, gpu->stream());
  mc.microbatch(wc, cpu->stream());
  gpu->synchronize();
  float lg = 0, lc = 0;
  gpu->download(&lg, mg.loss_slots());
  cpu->download(&lc, mc.loss_slots());
  EXPECT_NEAR(lg, lc, 1e-3 * lc);
  std::vector<std::vector<float>> first;  // f32 gradients (ArrayWeights in mixed precision)
  for (int i = 0; i < spec.num_params(); ++i) {
    const Tensor gg = wg.grad(i), gc = wc.grad(i);
    std::vector<float> a(static_cast<std::size_t>(gg.numel)), b(a.size());
    gpu->download(a.data(), gg);
    cpu->download(b.data(), gc);
    double num = 0, den = 0;
    for (std::size_t j = 0; j < a.size(); ++j) {
      const double x = a[j], y = b[j];
      num += (x - y) * (x - y);
      den += y * y;
    }
    EXPECT_LT(std::sqrt(num), 0.02 * std::sqrt(den) + 1e-9) << spec.params()[static_cast<std::size_t>(i)].name;
    first.push_back(a);
  }
  // Again from zero gradients: bitwise the same (no atomics, fixed launch shapes).
  for (int i = 0; i < spec.num_params(); ++i) gpu->zero(wg.grad(i), gpu->stream());
  mg.microbatch(wg, gpu->stream());
  gpu->synchronize();
  for (int i = 0; i < spec.num_params(); ++i) {
    std::vector<float> a(first[static_cast<std::size_t>(i)].size());
    gpu->download(a.data(), wg.grad(i));
    EXPECT_EQ(a, first[static_cast<std::size_t>(i)]) << spec.params()[static_cast<std::size_t>(i)].name;
  }
}

}  // namespace
}  // namespace trainer
