// nvfp4_grid.cuh - the launch shape the per-unit NVFP4 kernels share (the general path):
// a grid-stride loop of 256-thread blocks over a count of units (blocks of 16 x 16
// elements, data bytes or elements), one unit per thread per step; the table of a
// multi-tensor launch and the search of a unit's tensor in it (also used by the tiled
// kernels, nvfp4_tile.cuh).
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

/// The tensors of a launch: a device table of `count` entries, or one entry in the
/// kernel's parameters (list null).
template <class Entry>
struct Table {
  const Entry* list;
  int count;
  Entry one;

  __device__ const Entry& at(int i) const { return list != nullptr ? list[i] : one; }

  // The entry holding unit u of the sequence whose starts are `first` (e.g. first_block):
  // the last entry whose start is <= u (entries without units of the sequence share the
  // next one's start and are passed over).
  __device__ int find(std::int64_t u, std::int64_t Entry::*first) const {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (at(mid).*first <= u) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  // find(u, first) when the entry of unit u is likely `from` (the entry of the unit a
  // block worked on last): `from` itself when u lies in its units, else the search.
  __device__ int find_from(std::int64_t u, int from, std::int64_t Entry::*first) const {
    if (at(from).*first <= u && (from + 1 == count || at(from + 1).*first > u)) return from;
    return find(u, first);
  }
};

/// Whether a launch's device skip flag (may be null) says to write nothing.
__device__ __forceinline__ bool skipped(const std::int32_t* skip_flag) {
  return skip_flag != nullptr && *skip_flag != 0;
}

}  // namespace shardopt::nvfp4
