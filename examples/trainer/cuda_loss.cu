// cuda_loss.cu - CudaOps' loss: cross-entropy of the logits (its gradient written in the
// same pass) and the microbatch's mean loss, summed in a fixed order.
#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

constexpr int kLossThreads = 512;
__global__ void k_cross_entropy(const float* logits, const std::int32_t* targets, bf16* dlogits, float* token_loss,
                                float grad_scale, i64 T, i64 V) {
  __shared__ float shared[32];
  for (i64 t = blockIdx.x; t < T; t += gridDim.x) {
    const float* l = logits + t * V;
    float m = -INFINITY;
    for (i64 v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, l[v]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (i64 v = threadIdx.x; v < V; v += blockDim.x) s += expf(l[v] - m);
    s = block_sum(s, shared);
    const std::int32_t y = targets[t];
    if (threadIdx.x == 0) token_loss[t] = m + logf(s) - l[y];
    for (i64 v = threadIdx.x; v < V; v += blockDim.x) {
      const float p = expf(l[v] - m) / s;
      dlogits[t * V + v] = math::to_bf16(grad_scale * (p - (v == y ? 1.0f : 0.0f)));
    }
  }
}

__global__ void k_loss_reduce(const float* token_loss, float* loss_slots, const shardopt::MicrobatchState* mb, i64 T) {
  __shared__ float shared[32];
  float s = 0.0f;
  for (i64 t = threadIdx.x; t < T; t += blockDim.x) s += token_loss[t];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) loss_slots[mb != nullptr ? mb->index : 0] = s / static_cast<float>(T);
}

}  // namespace

void CudaOps::cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& token_loss,
                            const Tensor& loss_slots, const shardopt::MicrobatchState* mb, float grad_scale, std::int64_t T,
                            std::int64_t V, Stream s) {
  k_cross_entropy<<<blocks_for(T, 1), kLossThreads, 0, cu(s)>>>(logits.as<float>(), targets.as<std::int32_t>(),
                                                                 dlogits.as<bf16>(), token_loss.as<float>(),
                                                                 grad_scale, T, V);
  TRAINER_LAUNCHED();
  k_loss_reduce<<<1, kLossThreads, 0, cu(s)>>>(token_loss.as<float>(), loss_slots.as<float>(), mb, T);
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
