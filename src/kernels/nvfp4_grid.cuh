// nvfp4_grid.cuh - the launch shape the NVFP4 kernels share: a grid-stride loop of
// 256-thread blocks over a count of units (blocks of 16 x 16 elements, data bytes or
// elements), one unit per thread per step.
#pragma once

#include <algorithm>
#include <cstdint>

namespace shardopt::nvfp4 {

inline constexpr int kThreads = 256;

/// Blocks of a grid-stride launch over `units` units (at least 1, at most 65536).
inline int grid_for(std::int64_t units) {
  return static_cast<int>(std::clamp<std::int64_t>((units + kThreads - 1) / kThreads, 1, 65536));
}

/// This thread's first unit and the stride of the loop.
__device__ __forceinline__ std::int64_t first_unit() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t unit_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

}  // namespace shardopt::nvfp4
