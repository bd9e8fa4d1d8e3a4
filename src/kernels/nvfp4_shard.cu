// nvfp4_shard.cu - the sharded NVFP4 kernels, one thread per unit in grid-stride loops:
//   phase 1 (partial_amax_kernel): per block of the block rows the range touches, the
//     block's amax over the range's elements (the caller zeroed the buffer), folded into
//     the range's amax at [scale_numel()] with atomicMax;
//   phase 2 (shard_scales_kernel, shard_data_kernel): per block, its scale byte from the
//     combined amaxes (thread 0 also writes the two fp32 values); per data byte of the
//     range's byte span, the codes of the range's elements in it (others' nibbles 0).
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "kernels/nvfp4_grid.cuh"
#include "kernels/nvfp4_launch.hpp"
#include "kernels/nvfp4_math.cuh"
#include "kernels/nvfp4_units.cuh"

namespace shardopt::nvfp4 {
namespace {

__global__ void partial_amax_kernel(Nvfp4Shape s, Range range, Range blocks, const float* master,
                                    std::uint32_t* amax) {
  for (std::int64_t b = blocks.begin + first_unit(); b < blocks.end; b += unit_stride()) {
    const std::uint32_t a = block_amax(s, b, MasterSource{master, range.begin}, range.begin, range.end);
    amax[b] = a;
    if (a != 0) atomicMax(reinterpret_cast<unsigned int*>(amax + s.scale_numel()), a);
  }
}

__global__ void shard_scales_kernel(Nvfp4Shape s, const std::uint32_t* amax, Nvfp4Planes out) {
  const std::uint32_t tensor = amax[s.scale_numel()];
  for (std::int64_t b = first_unit(); b < s.scale_numel(); b += unit_stride()) {
    out.scale[b] = block_scale(amax[b], tensor);
    if (b == 0) {
      const GlobalScale g = global_scale(tensor);
      *out.amax = g.amax;
      *out.decode_scale = g.decode;
    }
  }
}

__global__ void shard_data_kernel(Nvfp4Shape s, Range range, Range bytes, const float* master,
                                  const std::uint32_t* amax, Nvfp4Planes out) {
  const float decode = global_scale(amax[s.scale_numel()]).decode;
  for (std::int64_t k = bytes.begin + first_unit(); k < bytes.end; k += unit_stride())
    out.data[k] = encode_byte(s, k, MasterSource{master, range.begin}, out.scale, decode, range.begin, range.end);
}

}  // namespace

void launch_partial_amax(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax,
                         Stream stream) {
  const Range blocks = touched_blocks(shape, range);
  partial_amax_kernel<<<grid_for(blocks.size()), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      shape, range, blocks, master, amax);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_quantize_shard(const Nvfp4Shape& shape, Range range, const float* master, const std::uint32_t* amax,
                           const Nvfp4Planes& out, Stream stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  shard_scales_kernel<<<grid_for(shape.scale_numel()), kThreads, 0, s>>>(shape, amax, out);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  const Range bytes = nvfp4_shard_bytes(range);
  if (bytes.size() == 0) return;
  shard_data_kernel<<<grid_for(bytes.size()), kThreads, 0, s>>>(shape, range, bytes, master, amax, out);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::nvfp4
