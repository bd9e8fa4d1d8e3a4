// cuda_moe.cu - CudaOps' mixture of experts: the top-1 router, the dispatch of tokens to
// expert slots (capacity C, in token order) and the gated combine, forward and backward.
#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

__global__ void k_router_forward(const float* logits, float* probs, std::int32_t* expert, float* gate, i64 T, int G) {
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < T; t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const float* l = logits + t * G;
    int best = 0;
    for (int j = 1; j < G; ++j)
      if (l[j] > l[best]) best = j;
    float s = 0.0f;
    for (int j = 0; j < G; ++j) s += expf(l[j] - l[best]);
    for (int j = 0; j < G; ++j) probs[t * G + j] = expf(l[j] - l[best]) / s;
    expert[t] = best;
    gate[t] = probs[t * G + best];
  }
}

__global__ void k_router_backward(const float* dgate, const float* probs, const std::int32_t* expert, bf16* dlogits,
                                  i64 T, int G) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * G; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = i / G;
    const int j = static_cast<int>(i % G);
    const float g = probs[t * G + expert[t]];
    const float onehot = j == expert[t] ? 1.0f : 0.0f;
    dlogits[i] = math::to_bf16(dgate[t] * g * (onehot - probs[i]));
  }
}

// One block per expert: slots in token order (a block-wide prefix count per tile of
// tokens), then the unused slots marked as padding.
constexpr int kDispatchThreads = 1024;
__global__ void k_dispatch_assign(const std::int32_t* expert, std::int32_t* slot, std::int32_t* row_token, i64 T,
                                  i64 C) {
  __shared__ std::int32_t warp_count[32];
  __shared__ i64 total;
  const int g = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  for (i64 base = 0; base < T; base += kDispatchThreads) {
    const i64 t = base + threadIdx.x;
    const bool mine = t < T && expert[t] == g;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    i64 before = total;
    for (int w = 0; w < warp; ++w) before += warp_count[w];
    before += __popc(ballot & ((1u << lane) - 1u));
    if (mine) {
      slot[t] = before < C ? static_cast<std::int32_t>(before) : -1;
      if (before < C) row_token[g * C + before] = static_cast<std::int32_t>(t);
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int w = 0; w < kDispatchThreads / 32; ++w) total += warp_count[w];
    __syncthreads();
  }
  const i64 used = total < C ? total : C;
  for (i64 s = used + threadIdx.x; s < C; s += blockDim.x) row_token[g * C + s] = -1;
}

__global__ void k_dispatch_gather(const bf16* x, const std::int32_t* row_token, bf16* xe, i64 rows, i64 H) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < rows * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const std::int32_t t = row_token[i / H];
    xe[i] = t >= 0 ? x[static_cast<i64>(t) * H + i % H] : bf16(0);
  }
}

__global__ void k_combine_forward(const float* ye, const std::int32_t* expert, const std::int32_t* slot,
                                  const float* gate, float* h, i64 T, i64 H, i64 C) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = i / H;
    if (slot[t] < 0) continue;
    h[i] += gate[t] * ye[(expert[t] * C + slot[t]) * H + i % H];
  }
}

__global__ void k_combine_backward_rows(const float* dh, const float* gate, const std::int32_t* row_token, bf16* dye,
                                        i64 rows, i64 H) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < rows * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const std::int32_t t = row_token[i / H];
    dye[i] = math::to_bf16(t >= 0 ? gate[t] * dh[static_cast<i64>(t) * H + i % H] : 0.0f);
  }
}

__global__ void k_combine_backward_gate(const float* dh, const float* ye, const std::int32_t* expert,
                                        const std::int32_t* slot, float* dgate, i64 T, i64 H, i64 C) {
  __shared__ float shared[32];
  for (i64 t = blockIdx.x; t < T; t += gridDim.x) {
    float s = 0.0f;
    if (slot[t] >= 0) {
      const float* y = ye + (expert[t] * C + slot[t]) * H;
      for (i64 k = threadIdx.x; k < H; k += blockDim.x) s += dh[t * H + k] * y[k];
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) dgate[t] = s;
  }
}

__global__ void k_dispatch_backward(const float* dxe, const std::int32_t* expert, const std::int32_t* slot, float* dx,
                                    i64 T, i64 H, i64 C) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = i / H;
    dx[i] = slot[t] >= 0 ? dxe[(expert[t] * C + slot[t]) * H + i % H] : 0.0f;
  }
}

}  // namespace

void CudaOps::router_forward(const Tensor& logits, const Tensor& probs, const Tensor& expert, const Tensor& gate,
                             std::int64_t T, int G, Stream s) {
  k_router_forward<<<blocks_for(T), kThreads, 0, cu(s)>>>(logits.as<float>(), probs.as<float>(),
                                                          expert.as<std::int32_t>(), gate.as<float>(), T, G);
  TRAINER_LAUNCHED();
}

void CudaOps::router_backward(const Tensor& dgate, const Tensor& probs, const Tensor& expert, const Tensor& dlogits,
                              std::int64_t T, int G, Stream s) {
  k_router_backward<<<blocks_for(T * G), kThreads, 0, cu(s)>>>(dgate.as<float>(), probs.as<float>(),
                                                               expert.as<std::int32_t>(), dlogits.as<bf16>(), T, G);
  TRAINER_LAUNCHED();
}

void CudaOps::dispatch(const Tensor& expert, const Tensor& x, const Tensor& slot, const Tensor& row_token, const Tensor& xe,
                       std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream s) {
  k_dispatch_assign<<<G, kDispatchThreads, 0, cu(s)>>>(expert.as<std::int32_t>(), slot.as<std::int32_t>(),
                                                       row_token.as<std::int32_t>(), T, C);
  TRAINER_LAUNCHED();
  k_dispatch_gather<<<blocks_for(G * C * H), kThreads, 0, cu(s)>>>(x.as<bf16>(), row_token.as<std::int32_t>(),
                                                                   xe.as<bf16>(), G * C, H);
  TRAINER_LAUNCHED();
}

void CudaOps::combine_forward(const Tensor& ye, const Tensor& expert, const Tensor& slot, const Tensor& gate, const Tensor& h,
                              std::int64_t T, std::int64_t H, std::int64_t C, Stream s) {
  k_combine_forward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(ye.as<float>(), expert.as<std::int32_t>(),
                                                               slot.as<std::int32_t>(), gate.as<float>(),
                                                               h.as<float>(), T, H, C);
  TRAINER_LAUNCHED();
}

void CudaOps::combine_backward(const Tensor& dh, const Tensor& ye, const Tensor& expert, const Tensor& slot,
                               const Tensor& gate, const Tensor& row_token, const Tensor& dye, const Tensor& dgate,
                               std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream s) {
  k_combine_backward_rows<<<blocks_for(G * C * H), kThreads, 0, cu(s)>>>(
      dh.as<float>(), gate.as<float>(), row_token.as<std::int32_t>(), dye.as<bf16>(), G * C, H);
  TRAINER_LAUNCHED();
  k_combine_backward_gate<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(
      dh.as<float>(), ye.as<float>(), expert.as<std::int32_t>(), slot.as<std::int32_t>(), dgate.as<float>(), T, H, C);
  TRAINER_LAUNCHED();
}

void CudaOps::dispatch_backward(const Tensor& dxe, const Tensor& expert, const Tensor& slot, const Tensor& dx,
                                std::int64_t T, std::int64_t H, std::int64_t C, Stream s) {
  k_dispatch_backward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(dxe.as<float>(), expert.as<std::int32_t>(),
                                                                 slot.as<std::int32_t>(), dx.as<float>(), T, H, C);
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
