// mxfp8.cu - the small elementwise MXFP8 kernels: scale bytes from exchanged u32 amaxes
// (scheme B) and dequantize. (Whole-tensor quantize: mxfp8_batch.cu; the sharded
// phases: mxfp8_shard.cu.)
#include <cuda_runtime.h>

#include <algorithm>

#include "core/check.hpp"
#include "kernels/common/kernel_files.hpp"
#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "kernels/mxfp8/mxfp8_math.cuh"

namespace shardopt::mxfp8 {
namespace {

__global__ void scales_from_amax_kernel(const std::uint32_t* amax_row, const std::uint32_t* amax_col,
                                        std::uint8_t* scale_row, std::uint8_t* scale_col, std::int64_t n_row,
                                        std::int64_t n_col) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n_row + n_col;
       k += stride) {
    if (k < n_row) {
      scale_row[k] = scale_from_amax_bits(amax_row[k]);
    } else {
      scale_col[k - n_row] = scale_from_amax_bits(amax_col[k - n_row]);
    }
  }
}

__global__ void dequantize_kernel(std::int64_t rows, std::int64_t cols, std::int64_t n, bool rowwise,
                                  const std::uint8_t* data, const std::uint8_t* scale, float* out) {
  const std::int64_t row_blocks = (cols + kBlock - 1) / kBlock, col_blocks = (rows + kBlock - 1) / kBlock;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::int64_t row = e / cols, c = e - row * cols;  // row counted across members
    const std::int64_t g = row / rows, r = row - g * rows;
    const std::int64_t k = rowwise ? row * row_blocks + c / kBlock : (g * col_blocks + r / kBlock) * cols + c;
    out[e] = decode_element(data[e], scale[k]);
  }
}

int elementwise_blocks(std::int64_t n) {
  return static_cast<int>(std::clamp<std::int64_t>((n + 255) / 256, 1, 65536));
}

}  // namespace

void launch_scales_from_amax(const Mxfp8Shape& shape, const std::uint32_t* amax_row, const std::uint32_t* amax_col,
                             std::uint8_t* scale_row, std::uint8_t* scale_col, Stream stream) {
  const std::int64_t n_row = shape.scale_row_numel(), n_col = shape.scale_col_numel();
  scales_from_amax_kernel<<<elementwise_blocks(n_row + n_col), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      amax_row, amax_col, scale_row, scale_col, n_row, n_col);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data, const std::uint8_t* scale,
                       float* out, Stream stream) {
  dequantize_kernel<<<elementwise_blocks(shape.numel()), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      shape.rows, shape.cols, shape.numel(), plane == Mxfp8Plane::Rowwise, data, scale, out);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::mxfp8

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void mxfp8_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(mxfp8::scales_from_amax_kernel));
  visit(kernel_symbol(mxfp8::dequantize_kernel));
}

}  // namespace shardopt::kernels
