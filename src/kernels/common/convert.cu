#include "core/check.hpp"
#include "kernels/common/convert.hpp"
#include "kernels/common/convert_math.cuh"
#include "kernels/common/kernel_files.hpp"
#include "shardopt/numerics.hpp"

namespace shardopt::kernels {
namespace {

template <DType S, DType D>
__global__ void convert_kernel(const void* __restrict__ src, void* __restrict__ dst, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_from_f32(dst, D, i, load_as_f32(src, S, i));
}

template <DType S, DType D>
__global__ void accumulate_kernel(const void* __restrict__ src, void* __restrict__ dst, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_from_f32(dst, D, i, load_as_f32(dst, D, i) + load_as_f32(src, S, i));
}

__global__ void remainder_join_kernel(const std::uint16_t* __restrict__ params,
                                      const std::uint16_t* __restrict__ remainders, float* __restrict__ master,
                                      std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    master[i] = num::remainder_join(params[i], remainders[i]);
}

__global__ void remainder_split_kernel(const float* __restrict__ master, std::uint16_t* __restrict__ params,
                                       std::uint16_t* __restrict__ remainders, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    params[i] = num::remainder_split_param(master[i]);
    remainders[i] = num::remainder_split_low(master[i]);
  }
}

unsigned elementwise_grid(std::int64_t n) {
  const std::int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

template <DType S>
void launch_accumulate(const void* src, void* dst, DType d, std::int64_t n, cudaStream_t s, unsigned grid) {
  switch (d) {
    case DType::f32: accumulate_kernel<S, DType::f32><<<grid, 256, 0, s>>>(src, dst, n); break;
    case DType::bf16: accumulate_kernel<S, DType::bf16><<<grid, 256, 0, s>>>(src, dst, n); break;
    case DType::f16: accumulate_kernel<S, DType::f16><<<grid, 256, 0, s>>>(src, dst, n); break;
    default: break;
  }
}

template <DType S>
void launch_to(const void* src, void* dst, DType d, std::int64_t n, cudaStream_t s, unsigned grid) {
  switch (d) {
    case DType::f32: convert_kernel<S, DType::f32><<<grid, 256, 0, s>>>(src, dst, n); break;
    case DType::bf16: convert_kernel<S, DType::bf16><<<grid, 256, 0, s>>>(src, dst, n); break;
    case DType::f16: convert_kernel<S, DType::f16><<<grid, 256, 0, s>>>(src, dst, n); break;
    default: break;
  }
}

}  // namespace

void remainder_join_cuda(const std::uint16_t* params, const std::uint16_t* remainders, float* master, std::int64_t n,
                         Stream stream) {
  remainder_join_kernel<<<elementwise_grid(n), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(params, remainders,
                                                                                                 master, n);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void remainder_split_cuda(const float* master, std::uint16_t* params, std::uint16_t* remainders, std::int64_t n,
                          Stream stream) {
  remainder_split_kernel<<<elementwise_grid(n), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(master, params,
                                                                                                  remainders, n);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void convert_cuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const std::int64_t blocks = (n + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
  switch (src_dtype) {
    case DType::f32: launch_to<DType::f32>(src, dst, dst_dtype, n, s, grid); break;
    case DType::bf16: launch_to<DType::bf16>(src, dst, dst_dtype, n, s, grid); break;
    case DType::f16: launch_to<DType::f16>(src, dst, dst_dtype, n, s, grid); break;
    default: break;
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void accumulate_cuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const std::int64_t blocks = (n + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
  switch (src_dtype) {
    case DType::f32: launch_accumulate<DType::f32>(src, dst, dst_dtype, n, s, grid); break;
    case DType::bf16: launch_accumulate<DType::bf16>(src, dst, dst_dtype, n, s, grid); break;
    case DType::f16: launch_accumulate<DType::f16>(src, dst, dst_dtype, n, s, grid); break;
    default: break;
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void convert_kernels_cuda(const KernelVisitor& visit) {
  auto to = [&]<DType S>() {
    visit(kernel_symbol(convert_kernel<S, DType::f32>));
    visit(kernel_symbol(convert_kernel<S, DType::bf16>));
    visit(kernel_symbol(convert_kernel<S, DType::f16>));
    visit(kernel_symbol(accumulate_kernel<S, DType::f32>));
    visit(kernel_symbol(accumulate_kernel<S, DType::bf16>));
    visit(kernel_symbol(accumulate_kernel<S, DType::f16>));
  };
  to.template operator()<DType::f32>();
  to.template operator()<DType::bf16>();
  to.template operator()<DType::f16>();
  visit(kernel_symbol(remainder_join_kernel));
  visit(kernel_symbol(remainder_split_kernel));
}

}  // namespace shardopt::kernels
