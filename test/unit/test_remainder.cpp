// The bf16 parameter + 16-bit remainder split of an fp32 master (numerics.hpp), against
// an oracle computed in double, and the fused Adam step's remainder variants (host twin)
// against its fp32-master variants on the same inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shardopt/error.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/numerics.hpp"

namespace {
using namespace shardopt;

/// x rounded to the nearest bf16, ties away from zero, computed in double from the two
/// bf16 neighbours of |x| (the truncation and the next value away from zero).
std::uint16_t oracle_param(float x) {
  const std::uint32_t u = num::f32_bits(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint16_t a_bits = static_cast<std::uint16_t>(u >> 16);
  const double a = static_cast<double>(num::bf16_to_f32(a_bits));
  if (static_cast<double>(x) == a) return a_bits;
  const std::uint16_t b_bits = static_cast<std::uint16_t>(a_bits + 1);
  const double b = (b_bits & 0x7FFFu) == 0x7F80u ? std::ldexp(std::copysign(1.0, static_cast<double>(x)), 128)
                                                  : static_cast<double>(num::bf16_to_f32(b_bits));
  return std::fabs(b - x) <= std::fabs(x - a) ? b_bits : a_bits;
}

void check_split(std::uint32_t bits) {
  const float x = num::f32_from_bits(bits);
  const std::uint16_t p = num::remainder_split_param(x), r = num::remainder_split_low(x);
  ASSERT_EQ(p, oracle_param(x)) << std::hex << "x bits 0x" << bits;
  ASSERT_EQ(r, bits & 0xFFFFu) << std::hex << "x bits 0x" << bits;
  const float back = num::remainder_join(p, r);
  if (std::isnan(x)) {
    ASSERT_TRUE(std::isnan(back)) << std::hex << "x bits 0x" << bits;
  } else {
    ASSERT_EQ(num::f32_bits(back), bits) << std::hex << "x bits 0x" << bits;
  }
  // Only an exact tie above an even bf16 rounds otherwise than to nearest even.
  const bool tie_above_even = !std::isnan(x) && (bits & 0xFFFFu) == 0x8000u && ((bits >> 16) & 1u) == 0;
  if (!tie_above_even) {
    ASSERT_EQ(p, num::f32_to_bf16(x)) << std::hex << "x bits 0x" << bits;
  } else {
    ASSERT_EQ(p, num::f32_to_bf16(x) + 1) << std::hex << "x bits 0x" << bits;
  }
}

TEST(Remainder, EveryLowHalfOfChosenHighHalves) {
  // Zeros, subnormals, ordinary values of both parities, the largest finite values, Inf
  // and NaN bands, with each sign.
  for (std::uint32_t hi : {0x0000u, 0x0001u, 0x007Fu, 0x0080u, 0x3F80u, 0x3F81u, 0x4049u, 0x7F7Eu, 0x7F7Fu, 0x7F80u,
                           0x7F81u, 0x7FC0u, 0x7FFFu}) {
    for (std::uint32_t sign : {0u, 0x8000u})
      for (std::uint32_t lo = 0; lo <= 0xFFFFu; ++lo) check_split(((hi | sign) << 16) | lo);
  }
}

TEST(Remainder, RandomMasters) {
  std::mt19937 rng(46);
  for (int k = 0; k < 2'000'000; ++k) check_split(static_cast<std::uint32_t>(rng()));
}

TEST(Remainder, WorkedExampleOfTheDocs) {
  // 1.00390625 lies exactly halfway between bf16 1.0 (0x3F80) and 1.0078125 (0x3F81).
  const float x = 1.00390625f;
  EXPECT_EQ(num::f32_bits(x), 0x3F808000u);
  EXPECT_EQ(num::remainder_split_param(x), 0x3F81u);
  EXPECT_EQ(num::remainder_split_low(x), 0x8000u);
  EXPECT_EQ(num::f32_bits(num::remainder_join(0x3F81u, 0x8000u)), 0x3F808000u);
  EXPECT_EQ(num::f32_to_bf16(x), 0x3F80u);
}

// The fused step with remainders keeps every master bit of the fp32-master step: the
// same random inputs through both variants (the host twin), 20 steps, each grad and
// moment dtype, Adam and AdamW, two groups, scalar heads and tails (unaligned chunks).
TEST(Remainder, FusedStepEqualsFp32MasterStep) {
  for (DType grad : {DType::f32, DType::bf16, DType::f16})
    for (DType moment : {DType::f32, DType::bf16})
      for (bool decoupled : {true, false}) {
        SCOPED_TRACE(std::string(to_string(grad)) + " grads, " + to_string(moment) + " moments, " +
                     (decoupled ? "AdamW" : "Adam"));
        constexpr std::int64_t n = 1000;
        std::mt19937 rng(7);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        std::vector<ShardChunk> chunks = {{0, 0, 333, 0, 0, 0}, {333, 333, 300, 1, 0, 0}, {633, 633, 367, 0, 0, 0}};
        AdamConfig c;
        c.decoupled_weight_decay = decoupled;
        c.grad_dtype = grad;
        c.param_dtype = DType::bf16;
        c.moment_dtype = moment;
        c.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 0.5}};
        AdamConfig cr = c;
        cr.master_storage = MasterStorage::bf16_remainder;
        std::vector<float> master(n);
        for (auto& x : master) x = dist(rng);
        std::vector<std::uint16_t> params_f(n), params_r(n), rem(n);
        for (std::int64_t i = 0; i < n; ++i) {
          params_f[static_cast<std::size_t>(i)] = num::f32_to_bf16(master[static_cast<std::size_t>(i)]);
          params_r[static_cast<std::size_t>(i)] = num::remainder_split_param(master[static_cast<std::size_t>(i)]);
          rem[static_cast<std::size_t>(i)] = num::remainder_split_low(master[static_cast<std::size_t>(i)]);
        }
        const std::size_t msize = size_of(moment);
        std::vector<std::uint8_t> m_f(n * msize, 0), v_f(n * msize, 0), m_r(n * msize, 0), v_r(n * msize, 0);
        std::vector<std::uint8_t> grads(n * size_of(grad));
        StepScalars sf{}, sr{};
        sf.lr = sr.lr = 1e-2f;
        sf.grad_norm = sr.grad_norm = 1.0f;
        for (int t = 0; t < 20; ++t) {
          for (std::int64_t i = 0; i < n; ++i) {
            const std::uint32_t code = num::encode(grad, dist(rng) * 0.3f);
            std::memcpy(grads.data() + static_cast<std::size_t>(i) * size_of(grad), &code, size_of(grad));
          }
          ShardPointers pf{chunks.data(), 3, n, 0, grads.data(), params_f.data(), master.data(), nullptr,
                           m_f.data(), v_f.data()};
          ShardPointers pr{chunks.data(), 3, n, 0, grads.data(), params_r.data(), nullptr, rem.data(),
                           m_r.data(), v_r.data()};
          fused_adam_step(c, pf, &sf, Backend::Host, nullptr);
          fused_adam_step(cr, pr, &sr, Backend::Host, nullptr);
        }
        ASSERT_EQ(m_f, m_r);
        ASSERT_EQ(v_f, v_r);
        for (std::int64_t i = 0; i < n; ++i) {
          const auto k = static_cast<std::size_t>(i);
          ASSERT_EQ(num::f32_bits(num::remainder_join(params_r[k], rem[k])), num::f32_bits(master[k])) << i;
          ASSERT_EQ(params_r[k], oracle_param(master[k])) << i;
        }
      }
}

TEST(Remainder, ConfigErrorsNameTheOption) {
  AdamConfig c;
  c.master_storage = MasterStorage::bf16_remainder;
  c.param_dtype = DType::f32;
  StepScalars s{};
  try {
    adam_step_apply(c, ShardPointers{}, &s, Backend::Host, nullptr);
    FAIL() << "expected Error(InvalidArgument)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("master_storage is bf16_remainder"), std::string::npos) << e.what();
  }
}

}  // namespace
