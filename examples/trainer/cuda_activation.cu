// cuda_activation.cu - CudaOps' elementwise ops: SiLU (the MoE model's MLPs), GELU (the
// GPT's) and the rounding of fp32 activations to bf16 (to_low).
#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

__global__ void k_silu_forward(const float* u, bf16* a, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    a[i] = math::to_bf16(math::silu(u[i]));
}

__global__ void k_silu_backward(const float* da, const float* u, bf16* du, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    du[i] = math::to_bf16(da[i] * math::silu_grad(u[i]));
}

__global__ void k_to_low(const float* x, bf16* y, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    y[i] = math::to_bf16(x[i]);
}

__global__ void k_gelu_forward(const float* u, bf16* a, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    a[i] = math::to_bf16(math::gelu(u[i]));
}

__global__ void k_gelu_backward(const float* da, const float* u, bf16* du, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    du[i] = math::to_bf16(da[i] * math::gelu_grad(u[i]));
}

}  // namespace

void CudaOps::silu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream s) {
  k_silu_forward<<<blocks_for(n), kThreads, 0, cu(s)>>>(u.as<float>(), a.as<bf16>(), n);
  TRAINER_LAUNCHED();
}

void CudaOps::silu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream s) {
  k_silu_backward<<<blocks_for(n), kThreads, 0, cu(s)>>>(da.as<float>(), u.as<float>(), du.as<bf16>(), n);
  TRAINER_LAUNCHED();
}

void CudaOps::gelu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream s) {
  k_gelu_forward<<<blocks_for(n), kThreads, 0, cu(s)>>>(u.as<float>(), a.as<bf16>(), n);
  TRAINER_LAUNCHED();
}

void CudaOps::gelu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream s) {
  k_gelu_backward<<<blocks_for(n), kThreads, 0, cu(s)>>>(da.as<float>(), u.as<float>(), du.as<bf16>(), n);
  TRAINER_LAUNCHED();
}

void CudaOps::to_low(const Tensor& x, const Tensor& y, std::int64_t n, Stream s) {
  k_to_low<<<blocks_for(n), kThreads, 0, cu(s)>>>(x.as<float>(), y.as<bf16>(), n);
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
