// cuda_rmsnorm.cu - CudaOps' RMSNorm: forward (one block per row), and backward: dx per
// row, dw as fixed-order partial sums over chunks of rows, then their sum.
#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

template <class W>
__global__ void k_rmsnorm_forward(const float* x, const W* w, bf16* y, float* rstd, i64 T, i64 H, float eps) {
  __shared__ float shared[32];
  for (i64 t = blockIdx.x; t < T; t += gridDim.x) {
    const float* row = x + t * H;
    float ss = 0.0f;
    for (i64 h = threadIdx.x; h < H; h += blockDim.x) ss += row[h] * row[h];
    ss = block_sum(ss, shared);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
    if (threadIdx.x == 0) rstd[t] = r;
    for (i64 h = threadIdx.x; h < H; h += blockDim.x) y[t * H + h] = math::to_bf16(row[h] * r * ld(w, h));
  }
}

template <class W>
__global__ void k_rmsnorm_backward_dx(const float* dy, const float* x, const W* w, const float* rstd, float* dx,
                                      i64 T, i64 H) {
  __shared__ float shared[32];
  for (i64 t = blockIdx.x; t < T; t += gridDim.x) {
    const float r = rstd[t];
    float dot = 0.0f;
    for (i64 h = threadIdx.x; h < H; h += blockDim.x) dot += dy[t * H + h] * ld(w, h) * x[t * H + h];
    dot = block_sum(dot, shared);
    const float c = dot * r * r * r / static_cast<float>(H);
    for (i64 h = threadIdx.x; h < H; h += blockDim.x)
      dx[t * H + h] += r * (dy[t * H + h] * ld(w, h)) - x[t * H + h] * c;
  }
}

// partial[c * H + h] = sum over rows t of chunk c of dy * x * rstd (fixed row order).
__global__ void k_rmsnorm_backward_partial(const float* dy, const float* x, const float* rstd, float* partial, i64 T,
                                           i64 H, i64 chunks) {
  const i64 rows = (T + chunks - 1) / chunks;
  for (i64 c = blockIdx.y; c < chunks; c += gridDim.y)
    for (i64 h = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; h < H; h += static_cast<i64>(gridDim.x) * blockDim.x) {
      float s = 0.0f;
      const i64 end = (c + 1) * rows < T ? (c + 1) * rows : T;
      for (i64 t = c * rows; t < end; ++t) s += dy[t * H + h] * x[t * H + h] * rstd[t];
      partial[c * H + h] = s;
    }
}

template <class D>
__global__ void k_rmsnorm_backward_dw(const float* partial, D* dw, i64 H, i64 chunks) {
  for (i64 h = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; h < H; h += static_cast<i64>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (i64 c = 0; c < chunks; ++c) s += partial[c * H + h];
    st(dw, h, ld(dw, h) + s);
  }
}

}  // namespace

void CudaOps::rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t T,
                              std::int64_t H, float eps, Stream s) {
  if (w.elem == Elem::f32)
    k_rmsnorm_forward<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(x.as<float>(), w.as<float>(), y.as<bf16>(),
                                                                 rstd.as<float>(), T, H, eps);
  else
    k_rmsnorm_forward<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(x.as<float>(), w.as<bf16>(), y.as<bf16>(),
                                                                 rstd.as<float>(), T, H, eps);
  TRAINER_LAUNCHED();
}

void CudaOps::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                               const Tensor& dw, const Tensor& partial, std::int64_t T, std::int64_t H, Stream s) {
  if (w.elem == Elem::f32)
    k_rmsnorm_backward_dx<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(dy.as<float>(), x.as<float>(), w.as<float>(),
                                                                     rstd.as<float>(), dx.as<float>(), T, H);
  else
    k_rmsnorm_backward_dx<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(dy.as<float>(), x.as<float>(), w.as<bf16>(),
                                                                     rstd.as<float>(), dx.as<float>(), T, H);
  TRAINER_LAUNCHED();
  const i64 chunks = rmsnorm_partial_size(T, H) / H;
  const dim3 grid(blocks_for(H), static_cast<unsigned>(chunks));
  k_rmsnorm_backward_partial<<<grid, kThreads, 0, cu(s)>>>(dy.as<float>(), x.as<float>(), rstd.as<float>(),
                                                           partial.as<float>(), T, H, chunks);
  TRAINER_LAUNCHED();
  if (dw.elem == Elem::f32)
    k_rmsnorm_backward_dw<<<blocks_for(H), kThreads, 0, cu(s)>>>(partial.as<float>(), dw.as<float>(), H, chunks);
  else
    k_rmsnorm_backward_dw<<<blocks_for(H), kThreads, 0, cu(s)>>>(partial.as<float>(), dw.as<bf16>(), H, chunks);
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
