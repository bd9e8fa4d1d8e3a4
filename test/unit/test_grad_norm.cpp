// The gradient-norm kernels on the host backend (the host twin, checked bitwise against
// the CUDA kernels by the GPU suite): the sum of squares against a double oracle, the
// same bits on every run and whatever the alignment of the grad buffer, non-finite
// detection anywhere in a chunk, accumulation over buffers, and finalize_grad_norm's
// clip coefficient and found-inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "adam_test_util.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fused_adam.hpp"

namespace {
using namespace shardopt;
using namespace adamtest;

double oracle_sumsq(const Problem& p, const Array& grads) {
  double s = 0;
  for (auto bi : p.buffer_index)
    if (bi >= 0) s += static_cast<double>(grads.get(bi)) * grads.get(bi);
  return s;
}

ShardPointers grad_pointers(const Problem& p, const void* grads) {
  ShardPointers s;
  s.chunks = p.chunks.data();
  s.num_chunks = static_cast<std::int64_t>(p.chunks.size());
  s.shard_numel = p.shard_numel;
  s.grads = grads;
  return s;
}

float run_sumsq(DType t, const Problem& p, const void* grads, float* nonfinite = nullptr) {
  StepScalars sc;
  accumulate_grad_sumsq(t, grad_pointers(p, grads), &sc, Backend::Host, nullptr);
  if (nonfinite) *nonfinite = sc.nonfinite;
  return sc.grad_sumsq;
}

TEST(GradNorm, SumOfSquaresMatchesDoubleOracle) {
  for (int scale : {1, 3}) {
    // Chunks from 1 to 2^16 elements; more chunks than kGradNormBlocks in one case.
    for (std::int64_t max_chunk : {std::int64_t{1}, std::int64_t{5}, std::int64_t{97}, std::int64_t{1} << 16}) {
      const Problem p = make_problem(odd_specs(scale), 3, 1, max_chunk, 1500);
      for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        Array g(t, p.buffer_numel);
        random_grads(g, 42, 3.0f);
        const double want = oracle_sumsq(p, g);
        const float got = run_sumsq(t, p, g.data());
        // fp32 accumulation of at most n positive terms per thread lane, then trees:
        // relative error below n_max * 2^-24 with n_max the longest chain (well under
        // the shard size); 1e-5 leaves a wide margin for these shards (< 6000 elements).
        EXPECT_NEAR(got, want, 1e-5 * want) << to_string(t) << " max_chunk " << max_chunk;
      }
    }
  }
}

TEST(GradNorm, SameBitsEveryRunAndAnyAlignment) {
  const Problem p = default_problem(3);
  Array g(DType::bf16, p.buffer_numel + 8);
  random_grads(g, 7, 1.0f);
  const float first = run_sumsq(DType::bf16, p, g.data());
  for (int r = 0; r < 3; ++r) {
    const float again = run_sumsq(DType::bf16, p, g.data());
    EXPECT_EQ(std::memcmp(&first, &again, 4), 0);
  }
  // The same values at a misaligned base (scalar loads on the device): same bits.
  Array shifted(DType::bf16, p.buffer_numel + 8);
  std::memcpy(static_cast<unsigned char*>(shifted.data()) + 2, g.data(), g.nbytes());
  const float moved = run_sumsq(DType::bf16, p, static_cast<unsigned char*>(shifted.data()) + 2);
  EXPECT_EQ(std::memcmp(&first, &moved, 4), 0);
}

TEST(GradNorm, FlagsNonFiniteAnywhere) {
  for (std::int64_t max_chunk : {std::int64_t{97}, std::int64_t{1} << 16}) {
    const Problem p = make_problem(odd_specs(2), 3, 1, max_chunk, 1500);
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
        // Every position of a few chunks: heads, vector bodies and tails.
        for (std::size_t ci : {std::size_t{0}, p.chunks.size() / 2, p.chunks.size() - 1}) {
          const ShardChunk& c = p.chunks[ci];
          for (std::int64_t i = 0; i < c.length; i += (c.length > 40 ? 7 : 1)) {
            Array g(t, p.buffer_numel);
            random_grads(g, 1, 1.0f);
            g.set(c.buffer_offset + i, bad);
            float nonfinite = 0;
            run_sumsq(t, p, g.data(), &nonfinite);
            ASSERT_EQ(nonfinite, 1.0f) << to_string(t) << " chunk " << ci << " element " << i;
          }
        }
        // A non-finite value outside the shard (another rank's slice) is not ours.
        Array g(t, p.buffer_numel);
        random_grads(g, 1, 1.0f);
        for (std::int64_t b = 0; b < p.buffer_numel; ++b)
          if (std::find(p.buffer_index.begin(), p.buffer_index.end(), b) == p.buffer_index.end()) g.set(b, bad);
        float nonfinite = 0;
        EXPECT_TRUE(std::isfinite(run_sumsq(t, p, g.data(), &nonfinite)));
        EXPECT_EQ(nonfinite, 0.0f);
      }
    }
  }
}

TEST(GradNorm, AccumulatesOverBuffersAndFinalizes) {
  const Problem a = default_problem(1), b = skewed_problem(2);
  Array ga(DType::f32, a.buffer_numel), gb(DType::bf16, b.buffer_numel);
  random_grads(ga, 3, 2.0f);
  random_grads(gb, 4, 0.5f);
  StepScalars sc;
  sc.inv_loss_scale = 0.25f;
  accumulate_grad_sumsq(DType::f32, grad_pointers(a, ga.data()), &sc, Backend::Host, nullptr);
  const float after_a = sc.grad_sumsq;
  accumulate_grad_sumsq(DType::bf16, grad_pointers(b, gb.data()), &sc, Backend::Host, nullptr);
  EXPECT_EQ(sc.grad_sumsq, after_a + run_sumsq(DType::bf16, b, gb.data())) << "adds into grad_sumsq";
  const double want = oracle_sumsq(a, ga) + oracle_sumsq(b, gb);
  EXPECT_NEAR(sc.grad_sumsq, want, 1e-5 * want);

  // finalize: norm of the unscaled grads, clip = min(1, max_norm / (norm + 1e-6)).
  const float norm = std::sqrt(sc.grad_sumsq) * 0.25f;
  StepScalars f = sc;
  finalize_grad_norm(1.0f, &f, Backend::Host, nullptr);
  EXPECT_EQ(f.grad_norm, norm);
  EXPECT_EQ(f.found_inf, 0);
  EXPECT_NEAR(f.clip_coef, 1.0 / (norm + 1e-6), 1e-6 / norm);
  f = sc;
  finalize_grad_norm(1e9f, &f, Backend::Host, nullptr);
  EXPECT_EQ(f.clip_coef, 1.0f) << "below max_norm: no clipping";
  f = sc;
  finalize_grad_norm(0.0f, &f, Backend::Host, nullptr);
  EXPECT_EQ(f.clip_coef, 1.0f) << "max_norm 0 disables clipping";

  // A non-finite count or an overflowing sum sets found_inf; found_inf is never cleared.
  f = sc;
  f.nonfinite = 1.0f;
  finalize_grad_norm(1.0f, &f, Backend::Host, nullptr);
  EXPECT_EQ(f.found_inf, 1);
  f = sc;
  f.grad_sumsq = std::numeric_limits<float>::infinity();
  finalize_grad_norm(1.0f, &f, Backend::Host, nullptr);
  EXPECT_EQ(f.found_inf, 1);
  f = sc;
  f.found_inf = 1;
  finalize_grad_norm(1.0f, &f, Backend::Host, nullptr);
  EXPECT_EQ(f.found_inf, 1);
  EXPECT_THROW(finalize_grad_norm(-1.0f, &f, Backend::Host, nullptr), Error);
  EXPECT_THROW(accumulate_grad_sumsq(DType::e4m3, grad_pointers(a, ga.data()), &f, Backend::Host, nullptr), Error);
}

}  // namespace
