// trainer_ops_pair.hpp - what the example trainer's CUDA-ops tests share (the MoE ops in
// test_trainer_ops_gpu.cpp, the GPT ops in test_trainer_gpt_ops_gpu.cpp): a fixture
// holding the CUDA ops and the mixed-precision host ops, tensors made on both, random
// data, and the f32 comparison within a tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "op_math.hpp"
#include "ops.hpp"

namespace trainer {

/// One tensor on each side: `g` of the CUDA ops, `c` of the host ops.
struct Twin {
  Buffer g, c;
};

/// The CUDA ops and the host ops (mixed precision), side by side.
class OpsPair : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> gpu = make_cuda_ops();
  std::unique_ptr<Ops> cpu = make_host_ops(Precision::Mixed);

  /// A zeroed tensor of n elements on each side.
  Twin make(Elem e, std::int64_t n) { return {gpu->alloc(e, n), cpu->alloc(e, n)}; }
  /// A tensor on each side holding the bytes of `v`.
  template <class V>
  Twin from(Elem e, const std::vector<V>& v) {
    Twin t = make(e, static_cast<std::int64_t>(v.size() * sizeof(V) / elem_size(e)));
    gpu->upload(t.g, v.data());
    cpu->upload(t.c, v.data());
    return t;
  }
  /// Tensor t of `ops`, after its work, as values of V.
  template <class V>
  std::vector<V> read(const Tensor& t, Ops& ops) {
    std::vector<V> out(t.bytes() / sizeof(V));
    ops.synchronize();
    ops.download(out.data(), t);
    return out;
  }
  /// The CUDA side of t, and the host side.
  template <class V>
  std::vector<V> rg(const Twin& t) { return read<V>(t.g, *gpu); }
  template <class V>
  std::vector<V> rc(const Twin& t) { return read<V>(t.c, *cpu); }
  Stream gs() { return gpu->stream(); }
  Stream cs() { return cpu->stream(); }
};

/// n normal floats of standard deviation `scale`, from `seed`.
inline std::vector<float> randf(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

/// randf rounded to bf16.
inline std::vector<std::uint16_t> randb(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::vector<std::uint16_t> v;
  for (float x : randf(n, seed, scale)) v.push_back(math::to_bf16(x));
  return v;
}

/// Every a[i] within atol + rtol |b[i]| of b[i].
inline void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rtol, double atol,
                         const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], atol + rtol * std::fabs(b[i])) << what << " element " << i;
}

}  // namespace trainer
