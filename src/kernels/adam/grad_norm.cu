// grad_norm.cu - CUDA kernels of the deterministic gradient sum of squares (two
// passes, fixed order: grad_norm.cuh) and of finalize_grad_norm.
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "kernels/adam/grad_norm_launch.hpp"
#include "kernels/common/kernel_files.hpp"

namespace shardopt::kernels {
namespace {

/// Pairwise tree over the block's shared values: t += t + stride, stride = T/2 .. 1.
__device__ __forceinline__ void block_tree(float* sum, float* bad) {
  const int t = threadIdx.x;
  __syncthreads();
#pragma unroll
  for (int stride = kGradNormThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) {
      sum[t] = sum[t] + sum[t + stride];
      bad[t] = bad[t] + bad[t + stride];
    }
    __syncthreads();
  }
}

template <DType G>
__global__ void __launch_bounds__(kGradNormThreads) grad_sumsq_kernel(const GradNormParams a) {
  __shared__ float sum[kGradNormThreads];
  __shared__ float bad[kGradNormThreads];
  sumsq_thread<G>(a, blockIdx.x, threadIdx.x, sum[threadIdx.x], bad[threadIdx.x]);
  block_tree(sum, bad);
  if (threadIdx.x == 0) {
    a.partials[blockIdx.x] = sum[0];
    a.partials[kGradNormBlocks + blockIdx.x] = bad[0];
  }
}

__global__ void __launch_bounds__(kGradNormThreads) grad_sumsq_finish_kernel(const GradNormParams a) {
  __shared__ float sum[kGradNormThreads];
  __shared__ float bad[kGradNormThreads];
  finish_thread(a.partials, threadIdx.x, sum[threadIdx.x], bad[threadIdx.x]);
  block_tree(sum, bad);
  if (threadIdx.x == 0) add_norm_total(a.scalars, sum[0], bad[0]);
}

__global__ void finalize_grad_norm_kernel(float max_norm, StepScalars* scalars) { finalize_norm(max_norm, scalars); }

}  // namespace

void launch_grad_sumsq(DType grad_dtype, const GradNormParams& a, Stream stream) {
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  switch (grad_dtype) {
    case DType::f32: grad_sumsq_kernel<DType::f32><<<kGradNormBlocks, kGradNormThreads, 0, s>>>(a); break;
    case DType::bf16: grad_sumsq_kernel<DType::bf16><<<kGradNormBlocks, kGradNormThreads, 0, s>>>(a); break;
    default: grad_sumsq_kernel<DType::f16><<<kGradNormBlocks, kGradNormThreads, 0, s>>>(a); break;
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  grad_sumsq_finish_kernel<<<1, kGradNormThreads, 0, s>>>(a);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_finalize_grad_norm(float max_norm, StepScalars* scalars, Stream stream) {
  finalize_grad_norm_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(max_norm, scalars);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void grad_norm_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(grad_sumsq_kernel<DType::f32>));
  visit(kernel_symbol(grad_sumsq_kernel<DType::bf16>));
  visit(kernel_symbol(grad_sumsq_kernel<DType::f16>));
  visit(kernel_symbol(grad_sumsq_finish_kernel));
  visit(kernel_symbol(finalize_grad_norm_kernel));
}

}  // namespace shardopt::kernels
