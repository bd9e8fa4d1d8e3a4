// grad_norm_host.cpp - host twin of the gradient sum of squares: it runs every thread
// of both passes of grad_norm.cu in turn, with the same per-thread code and the same
// tree, so its result is bitwise the kernel's.
#include <array>

#include "kernels/adam/grad_norm_launch.hpp"

namespace shardopt::kernels {
namespace {

void tree(std::array<float, kGradNormThreads>& sum, std::array<float, kGradNormThreads>& bad) {
  for (int stride = kGradNormThreads / 2; stride > 0; stride >>= 1) {
    for (int t = 0; t < stride; ++t) {
      sum[t] = sum[t] + sum[t + stride];
      bad[t] = bad[t] + bad[t + stride];
    }
  }
}

template <DType G>
void first_pass(const GradNormParams& a) {
  std::array<float, kGradNormThreads> sum{}, bad{};
  for (int b = 0; b < kGradNormBlocks; ++b) {
    if (b >= a.num_chunks) {  // such a block meets no chunk: every thread has 0
      a.partials[b] = 0.0f;
      a.partials[kGradNormBlocks + b] = 0.0f;
      continue;
    }
    for (int t = 0; t < kGradNormThreads; ++t) sumsq_thread<G>(a, b, t, sum[t], bad[t]);
    tree(sum, bad);
    a.partials[b] = sum[0];
    a.partials[kGradNormBlocks + b] = bad[0];
  }
}

}  // namespace

void host_grad_sumsq(DType grad_dtype, const GradNormParams& a) {
  switch (grad_dtype) {
    case DType::f32: first_pass<DType::f32>(a); break;
    case DType::bf16: first_pass<DType::bf16>(a); break;
    default: first_pass<DType::f16>(a); break;
  }
  std::array<float, kGradNormThreads> sum{}, bad{};
  for (int t = 0; t < kGradNormThreads; ++t) finish_thread(a.partials, t, sum[t], bad[t]);
  tree(sum, bad);
  add_norm_total(a.scalars, sum[0], bad[0]);
}

}  // namespace shardopt::kernels
