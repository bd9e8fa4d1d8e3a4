// nvfp4_shard.cu - the sharded NVFP4 kernels over one tensor or a list (an
// Nvfp4ShardBatch), one thread per unit in grid-stride loops over the units of all
// tensors, two launches per phase whatever the number of tensors:
//   phase 1: zero_amax_kernel (per amax entry: 0), then partial_amax_kernel (per block of
//     the block rows a range touches, the block's amax over the range's elements, folded
//     into the range's amax at [scale_numel()] with atomicMax);
//   phase 2: shard_scales_kernel (per block, its scale byte from the combined amaxes;
//     block 0 also writes the two fp32 values), then shard_data_kernel (per data byte of
//     a range's byte span, the codes of the range's elements in it, others' nibbles 0,
//     written at out.data[k - span.begin]).
// A unit finds its tensor by a binary search over the entries' first unit.
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "kernels/nvfp4_grid.cuh"
#include "kernels/nvfp4_launch.hpp"
#include "kernels/nvfp4_math.cuh"
#include "kernels/nvfp4_units.cuh"

namespace shardopt::nvfp4 {
namespace {

using ShardTable = Table<ShardEntry>;

__global__ void zero_amax_kernel(ShardTable t, std::int64_t units) {
  for (std::int64_t u = first_unit(); u < units; u += unit_stride()) {
    const ShardEntry& e = t.at(t.find(u, &ShardEntry::first_amax));
    e.amax[u - e.first_amax] = 0;
  }
}

__global__ void partial_amax_kernel(ShardTable t, std::int64_t units) {
  for (std::int64_t u = first_unit(); u < units; u += unit_stride()) {
    const ShardEntry& e = t.at(t.find(u, &ShardEntry::first_touched));
    const std::int64_t b = e.touched.begin + (u - e.first_touched);
    const std::uint32_t a =
        block_amax(e.shape, b, MasterSource{e.master, e.range.begin}, e.range.begin, e.range.end);
    e.amax[b] = a;
    if (a != 0) atomicMax(reinterpret_cast<unsigned int*>(e.amax + e.shape.scale_numel()), a);
  }
}

__global__ void shard_scales_kernel(ShardTable t, std::int64_t units) {
  for (std::int64_t u = first_unit(); u < units; u += unit_stride()) {
    const ShardEntry& e = t.at(t.find(u, &ShardEntry::first_block));
    const std::int64_t b = u - e.first_block;
    const std::uint32_t tensor = e.amax[e.shape.scale_numel()];
    e.out.scale[b] = block_scale(e.amax[b], tensor);
    if (b == 0) {
      const GlobalScale g = global_scale(tensor);
      *e.out.amax = g.amax;
      *e.out.decode_scale = g.decode;
    }
  }
}

__global__ void shard_data_kernel(ShardTable t, std::int64_t units) {
  for (std::int64_t u = first_unit(); u < units; u += unit_stride()) {
    const ShardEntry& e = t.at(t.find(u, &ShardEntry::first_byte));
    const float decode = global_scale(e.amax[e.shape.scale_numel()]).decode;
    const std::int64_t j = u - e.first_byte;  // the byte's index in the shard's span
    e.out.data[j] = encode_byte(e.shape, e.range.begin / 2 + j, MasterSource{e.master, e.range.begin}, e.out.scale,
                                decode, e.range.begin, e.range.end);
  }
}

}  // namespace

void launch_partial_amax(const ShardEntry* entries, int count, const ShardEntry& one, const ShardUnits& units,
                         Stream stream) {
  const ShardTable t{entries, count, one};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  zero_amax_kernel<<<grid_for(units.amax), kThreads, 0, s>>>(t, units.amax);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  partial_amax_kernel<<<grid_for(units.touched), kThreads, 0, s>>>(t, units.touched);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_quantize_shard(const ShardEntry* entries, int count, const ShardEntry& one, const ShardUnits& units,
                           Stream stream) {
  const ShardTable t{entries, count, one};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  shard_scales_kernel<<<grid_for(units.blocks), kThreads, 0, s>>>(t, units.blocks);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  shard_data_kernel<<<grid_for(units.bytes), kThreads, 0, s>>>(t, units.bytes);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::nvfp4
