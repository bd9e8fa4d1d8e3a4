// adam_test_util.hpp - shared pieces of the fused Adam tests (host and GPU): a shard
// with odd lengths, several buckets and unaligned chunk boundaries; typed host arrays;
// and the plain double-precision oracle written from DESIGN.md (not from the code
// under test).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shardopt/dtype.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/numerics.hpp"

namespace adamtest {

using shardopt::DType;

/// A host array of one float storage dtype.
struct Array {
  DType dtype = DType::f32;
  std::int64_t n = 0;
  std::vector<unsigned char> bytes;

  Array() = default;
  Array(DType t, std::int64_t count)
      : dtype(t), n(count), bytes(static_cast<std::size_t>(count) * shardopt::size_of(t) + 16, 0) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(n) * shardopt::size_of(dtype); }
  std::uint32_t bits(std::int64_t i) const {
    std::uint32_t u = 0;
    std::memcpy(&u, bytes.data() + static_cast<std::size_t>(i) * shardopt::size_of(dtype), shardopt::size_of(dtype));
    return u;
  }
  float get(std::int64_t i) const { return shardopt::num::decode(dtype, bits(i)); }
  void set(std::int64_t i, float f) {
    const std::uint32_t u = shardopt::num::encode(dtype, f);
    std::memcpy(bytes.data() + static_cast<std::size_t>(i) * shardopt::size_of(dtype), &u, shardopt::size_of(dtype));
  }
};

/// Rounds a double to what a `t` storage element holds (via fp32; for bf16/f16 the
/// double rounding is within the tolerances that use it).
inline double round_to(DType t, double x) {
  return static_cast<double>(shardopt::num::decode(t, shardopt::num::encode(t, static_cast<float>(x))));
}

/// A rank's shard of one layout buffer: the chunk table and, per shard element, its
/// buffer index and group (-1 for padding).
struct Problem {
  shardopt::Layout layout;
  int rank = 0;
  std::int64_t buffer_numel = 0;
  std::int64_t shard_numel = 0;
  std::vector<shardopt::ShardChunk> chunks;
  std::vector<std::int64_t> buffer_index;  ///< per shard element; -1 for padding
  std::vector<int> group;                  ///< per shard element; -1 for padding
};

/// Odd-shaped params in two groups ("decay", "no_decay"), world 3, small buckets, so
/// that segments start at unaligned offsets and buffer offsets differ from shard offsets.
inline std::vector<shardopt::ParamSpec> odd_specs(int scale = 1) {
  using shardopt::ParamSpec;
  return {
      ParamSpec::tensor("a", {37 * scale, 5}, DType::bf16, "decay"),
      ParamSpec::tensor("a_norm", {113}, DType::bf16, "no_decay"),
      ParamSpec::tensor("b", {3 * scale, 129}, DType::bf16, "decay"),
      ParamSpec::tensor("c", {1001 * scale}, DType::bf16, "decay"),
      ParamSpec::tensor("c_norm", {171 * scale}, DType::bf16, "no_decay"),
      ParamSpec::tensor("d", {64, 33 * scale}, DType::bf16, "decay"),
      ParamSpec::tensor("e", {1}, DType::bf16, "no_decay"),
      ParamSpec::tensor("f", {257 * scale, 3}, DType::bf16, "decay"),
  };
}

inline Problem make_problem(std::vector<shardopt::ParamSpec> specs, int world, int rank, std::int64_t max_chunk,
                            std::int64_t bucket_numel, std::int64_t alignment = 1,
                            std::int64_t pad_multiple = 0) {
  shardopt::LayoutOptions opt;
  opt.bucket_numel = bucket_numel;
  opt.alignment = alignment;
  if (pad_multiple > 0) opt.pad_multiple = pad_multiple;
  Problem p{shardopt::Layout(std::move(specs), world, opt), rank, 0, 0, {}, {}, {}};
  const auto& buf = p.layout.buffers().at(0);
  p.buffer_numel = buf.numel;
  p.shard_numel = buf.shard_numel;
  p.chunks = shardopt::shard_chunks(p.layout, 0, rank, max_chunk);
  p.buffer_index.assign(static_cast<std::size_t>(p.shard_numel), -1);
  p.group.assign(static_cast<std::size_t>(p.shard_numel), -1);
  for (const auto& c : p.chunks)
    for (std::int64_t i = 0; i < c.length; ++i) {
      p.buffer_index[static_cast<std::size_t>(c.shard_offset + i)] = c.buffer_offset + i;
      p.group[static_cast<std::size_t>(c.shard_offset + i)] = c.group;
    }
  return p;
}

/// The default test problem: world 3, rank 1, chunks of at most 97 elements; params
/// start at any element (alignment 1). Buckets are padded to 384, so a slice's shard and
/// buffer offsets agree modulo 8 and chunks have vector bodies on the GPU.
inline Problem default_problem(int scale = 1) { return make_problem(odd_specs(scale), 3, 1, 97, 1500); }

/// Like default_problem, but buckets padded only to a multiple of 3: slices start at
/// offsets that are not congruent modulo the vector width, so some chunks take the
/// all-scalar path on the GPU.
inline Problem skewed_problem(int scale = 1) { return make_problem(odd_specs(scale), 3, 1, 97, 1500, 1, 3); }

/// Host state of one shard: buffers as the optimizer holds them.
struct State {
  Array grads;   ///< full grad buffer (buffer_numel)
  Array params;  ///< full param buffer (buffer_numel), output
  std::vector<float> master;
  Array exp_avg, exp_avg_sq;

  State(const Problem& p, const shardopt::AdamConfig& c, std::uint64_t seed)
      : grads(c.grad_dtype, p.buffer_numel),
        params(c.write_params ? c.param_dtype : DType::f32, p.buffer_numel),
        master(static_cast<std::size_t>(p.shard_numel), 0.0f),
        exp_avg(c.moment_dtype, p.shard_numel),
        exp_avg_sq(c.moment_dtype, p.shard_numel) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : master) x = normal(rng);
    // Start from nonzero moments (as after some steps) to exercise every term.
    for (std::int64_t i = 0; i < p.shard_numel; ++i) {
      exp_avg.set(i, 0.01f * normal(rng));
      const float s = 0.01f * normal(rng);
      exp_avg_sq.set(i, s * s);
    }
  }

  shardopt::ShardPointers pointers(const Problem& p) {
    shardopt::ShardPointers s;
    s.chunks = p.chunks.data();
    s.num_chunks = static_cast<std::int64_t>(p.chunks.size());
    s.shard_numel = p.shard_numel;
    s.grads = grads.data();
    s.params = params.data();
    s.master = master.data();
    s.exp_avg = exp_avg.data();
    s.exp_avg_sq = exp_avg_sq.data();
    return s;
  }
};

/// Fills the grad buffer with N(0, scale^2) values (rounded to the grad dtype).
inline void random_grads(Array& grads, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < grads.n; ++i) grads.set(i, scale * normal(rng));
}

/// Per-step inputs of the oracle.
struct StepInputs {
  float lr = 1e-3f;
  float inv_loss_scale = 1.0f;
  float clip_coef = 1.0f;
};

/// The oracle's state of one shard element (double; p, m and v rounded to the storage
/// dtypes at the end of each step, since that is what the optimizer keeps between steps).
struct OracleElem {
  double p = 0, m = 0, v = 0;
};

/// One Adam/AdamW step of one element, in double, from DESIGN.md:
/// g = grad * inv_loss_scale * clip; AdamW: p -= lr wd p; Adam: g += wd p;
/// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
inline void oracle_step(const shardopt::AdamConfig& c, int group, std::int64_t t, const StepInputs& in,
                        double grad, OracleElem& e) {
  const double lr = static_cast<double>(in.lr) * c.groups[static_cast<std::size_t>(group)].lr_scale;
  const double wd = c.groups[static_cast<std::size_t>(group)].weight_decay;
  double g = grad * in.inv_loss_scale * in.clip_coef;
  if (c.decoupled_weight_decay)
    e.p -= lr * wd * e.p;
  else
    g += wd * e.p;
  // The moments are fp32 values within the step (fp32 math: a v beyond FLT_MAX is +Inf),
  // stored in the moment dtype between steps.
  e.m = round_to(DType::f32, c.beta1 * e.m + (1.0 - c.beta1) * g);
  e.v = round_to(DType::f32, c.beta2 * e.v + (1.0 - c.beta2) * g * g);
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
  e.p -= (lr / bc1) * e.m / (std::sqrt(e.v) / std::sqrt(bc2) + c.eps);
  e.p = round_to(DType::f32, e.p);
  e.m = round_to(c.moment_dtype, e.m);
  e.v = round_to(c.moment_dtype, e.v);
}

/// Every variant the kernels compile: grads x moments x param output x Adam/AdamW.
inline std::vector<shardopt::AdamConfig> all_variants() {
  std::vector<shardopt::AdamConfig> out;
  for (DType g : {DType::f32, DType::bf16, DType::f16})
    for (DType m : {DType::f32, DType::bf16})
      for (int p = 0; p < 4; ++p)
        for (bool decoupled : {true, false}) {
          shardopt::AdamConfig c;
          c.grad_dtype = g;
          c.moment_dtype = m;
          c.write_params = p < 3;
          c.param_dtype = p == 0 ? DType::f32 : p == 1 ? DType::bf16 : DType::f16;
          c.decoupled_weight_decay = decoupled;
          c.groups = {shardopt::AdamGroup{0.1, 1.0}, shardopt::AdamGroup{0.0, 0.5}};
          out.push_back(c);
        }
  return out;
}

/// "grad=bf16 moment=f32 param=bf16 AdamW" for messages.
inline std::string describe(const shardopt::AdamConfig& c) {
  return std::string("grad=") + shardopt::to_string(c.grad_dtype) + " moment=" +
         shardopt::to_string(c.moment_dtype) + " param=" +
         (c.write_params ? shardopt::to_string(c.param_dtype) : "none") +
         (c.decoupled_weight_decay ? " AdamW" : " Adam");
}

/// The lr schedule of the 100-step tests: warm-up then cosine-like, around 1e-3.
inline float schedule_lr(int step) {
  const float warm = step < 10 ? static_cast<float>(step + 1) / 10.0f : 1.0f;
  return 1e-3f * warm * (0.6f + 0.4f * std::cos(0.05f * static_cast<float>(step)));
}

}  // namespace adamtest
