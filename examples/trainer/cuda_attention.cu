// cuda_attention.cu - CudaOps' causal softmax of the GPT's attention scores (forward and
// backward). The attention GEMMs are CudaOps::gemm's (cuda_gemm.cu).
#include <algorithm>

#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

// One block per score row (row i of its S x S block attends to j <= i).
__global__ void k_causal_softmax_forward(const float* x, float* p, bf16* pl, i64 rows, i64 S) {
  __shared__ float shared[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const i64 i = r % S;
    const float* xr = x + r * S;
    float m = -INFINITY;
    for (i64 j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (i64 j = threadIdx.x; j <= i; j += blockDim.x) s += expf(xr[j] - m);
    s = block_sum(s, shared);
    for (i64 j = threadIdx.x; j < S; j += blockDim.x) {
      const float v = j <= i ? expf(xr[j] - m) / s : 0.0f;
      p[r * S + j] = v;
      pl[r * S + j] = math::to_bf16(v);
    }
  }
}

__global__ void k_causal_softmax_backward(const float* dp, const float* p, bf16* ds, i64 rows, i64 S) {
  __shared__ float shared[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const i64 i = r % S;
    float dot = 0.0f;
    for (i64 j = threadIdx.x; j <= i; j += blockDim.x) dot += p[r * S + j] * dp[r * S + j];
    dot = block_sum(dot, shared);
    for (i64 j = threadIdx.x; j < S; j += blockDim.x)
      ds[r * S + j] = math::to_bf16(j <= i ? p[r * S + j] * (dp[r * S + j] - dot) : 0.0f);
  }
}

}  // namespace

void CudaOps::causal_softmax_forward(const Tensor& scores, const Tensor& probs, const Tensor& probs_low, std::int64_t blocks,
                                     std::int64_t S, Stream s) {
  const i64 rows = blocks * S;
  k_causal_softmax_forward<<<static_cast<unsigned>(std::min<i64>(rows, 65536)), kThreads, 0, cu(s)>>>(
      scores.as<float>(), probs.as<float>(), probs_low.as<bf16>(), rows, S);
  TRAINER_LAUNCHED();
}

void CudaOps::causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores, std::int64_t blocks,
                                      std::int64_t S, Stream s) {
  const i64 rows = blocks * S;
  k_causal_softmax_backward<<<static_cast<unsigned>(std::min<i64>(rows, 65536)), kThreads, 0, cu(s)>>>(
      dprobs.as<float>(), probs.as<float>(), dscores.as<bf16>(), rows, S);
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
