// nvfp4.cu - whole-tensor NVFP4 quantization (one tensor or a list, in the same three
// launches) and dequantize.
//
// Quantize, one thread per unit, grid-stride loops over the units of all tensors:
//   1. zero_amax:  each tensor's amax slot (one thread per tensor);
//   2. amax:       per 16 x 16 block, its amax (integer max of f32 bits), folded into the
//                  tensor's slot with atomicMax (non-negative f32 bits order as unsigned;
//                  a NaN / Inf element counts as 0x7FC00000, above them all);
//   3. scales:     per block, its amax again and the scale byte from it and the tensor's
//                  amax; the block-0 thread writes decode_scale;
//   4. data:       per data byte, its two elements' E2M1 codes.
// A block's amax is read twice (steps 2 and 3) instead of being kept in scratch memory:
// the API has no scratch, and the reads are cheap next to correctness of the layout.
// Step 4 works per byte, so two elements of one byte (an odd cols puts them in two
// blocks) are written by one thread.
// A unit finds its tensor by a binary search over the entries' first unit. Every kernel
// returns at once when the device skip flag is set (all four read the same flag, so a
// skipped call writes nothing).
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "kernels/nvfp4_grid.cuh"
#include "kernels/nvfp4_launch.hpp"
#include "kernels/nvfp4_math.cuh"
#include "kernels/nvfp4_units.cuh"

namespace shardopt::nvfp4 {
namespace {

using QuantizeTable = Table<QuantizeEntry>;

__device__ std::uint32_t tensor_amax(const QuantizeEntry& e) {
  return *reinterpret_cast<const std::uint32_t*>(e.out.amax);
}

__global__ void zero_amax_kernel(QuantizeTable t, const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  for (std::int64_t i = first_unit(); i < t.count; i += unit_stride()) *t.at(static_cast<int>(i)).out.amax = 0.0f;
}

__global__ void amax_kernel(QuantizeTable t, std::int64_t blocks, const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  for (std::int64_t u = first_unit(); u < blocks; u += unit_stride()) {
    const QuantizeEntry& e = t.at(t.find(u, &QuantizeEntry::first_block));
    const std::uint32_t a = block_amax(e.shape, u - e.first_block, Bf16Source{e.src}, 0, e.shape.numel());
    if (a != 0) atomicMax(reinterpret_cast<unsigned int*>(e.out.amax), a);
  }
}

__global__ void scales_kernel(QuantizeTable t, std::int64_t blocks, const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  for (std::int64_t u = first_unit(); u < blocks; u += unit_stride()) {
    const QuantizeEntry& e = t.at(t.find(u, &QuantizeEntry::first_block));
    const std::int64_t b = u - e.first_block;
    const std::uint32_t a = block_amax(e.shape, b, Bf16Source{e.src}, 0, e.shape.numel());
    e.out.scale[b] = block_scale(a, tensor_amax(e));
    if (b == 0) *e.out.decode_scale = global_scale(tensor_amax(e)).decode;
  }
}

__global__ void data_kernel(QuantizeTable t, std::int64_t bytes, const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  for (std::int64_t u = first_unit(); u < bytes; u += unit_stride()) {
    const QuantizeEntry& e = t.at(t.find(u, &QuantizeEntry::first_byte));
    const float decode = global_scale(tensor_amax(e)).decode;
    e.out.data[u - e.first_byte] =
        encode_byte(e.shape, u - e.first_byte, Bf16Source{e.src}, e.out.scale, decode, 0, e.shape.numel());
  }
}

__global__ void dequantize_kernel(Nvfp4Shape s, const std::uint8_t* data, const std::uint8_t* scale,
                                  const float* decode_scale, float* out_f32, std::uint16_t* out_bf16,
                                  const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  const float decode = *decode_scale;
  for (std::int64_t i = first_unit(); i < s.numel(); i += unit_stride()) {
    const float v = decode_at(s, i, data, scale, decode);
    if (out_f32 != nullptr) out_f32[i] = v;
    if (out_bf16 != nullptr) out_bf16[i] = num::f32_to_bf16(v);
  }
}

}  // namespace

void launch_quantize(const QuantizeEntry* entries, int count, const QuantizeEntry& one, std::int64_t blocks,
                     std::int64_t bytes, const std::int32_t* skip_flag, Stream stream) {
  const QuantizeTable t{entries, count, one};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  zero_amax_kernel<<<grid_for(count), kThreads, 0, s>>>(t, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  amax_kernel<<<grid_for(blocks), kThreads, 0, s>>>(t, blocks, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  scales_kernel<<<grid_for(blocks), kThreads, 0, s>>>(t, blocks, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  data_kernel<<<grid_for(bytes), kThreads, 0, s>>>(t, bytes, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                       const float* decode_scale, float* out_f32, std::uint16_t* out_bf16,
                       const std::int32_t* skip_flag, Stream stream) {
  dequantize_kernel<<<grid_for(shape.numel()), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      shape, data, scale, decode_scale, out_f32, out_bf16, skip_flag);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::nvfp4
