// mxfp8_walk.cuh - how the persistent MXFP8 kernels (mxfp8_batch.cu: whole tensors;
// mxfp8_shard.cu: a rank's ranges) share a sequence of tiles among the blocks of one
// wave, and the pointer hint they both use.
//
// Walk: block b of G takes runs b, b + G, b + 2G, ... of R consecutive tiles (R a power
// of two). The blocks running at any moment then work on G * R neighbouring tiles,
// which DRAM serves better than blocks walking distant parts of the sequence (the
// measurements are in docs/decisions.md, "MXFP8 quantize: the order of tiles").
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/common/device_attribute.cuh"

namespace shardopt::mxfp8 {

/// `p`, which points to global memory: lets the compiler emit global (not generic)
/// loads and stores through pointers read from a table in memory.
template <class T>
__device__ __forceinline__ T* in_global(T* p) {
  __builtin_assume(__isGlobal(p));
  return p;
}

/// The entry table of a per-tensor launch: one entry, passed by value in the kernel's
/// parameters (so a fresh start reads no global memory). kRun: the longest run of the
/// walk (Walk) its kernel takes.
template <class Entry, int kRun>
struct OneEntry {
  static constexpr int kMaxRun = kRun;
  static constexpr bool kInParameters = true;  ///< reading the entry touches no global memory
  Entry entry;
  __device__ const Entry& operator[](int) const { return entry; }
  __device__ int find(std::int64_t, int) const { return 0; }
};

/// The entry table of a batch: `count` entries in device memory whose tile ranges
/// [first_tile, end_tile) follow each other from 0 (empty ones included).
template <class Entry, int kRun>
struct EntryList {
  static constexpr int kMaxRun = kRun;
  static constexpr bool kInParameters = false;
  const Entry* entries;
  int count;
  __device__ const Entry& operator[](int e) const { return entries[e]; }
  /// The index of the entry holding tile `t`, searched from entry `from` (which starts
  /// at or before t): `from` itself in the common case, else a binary search for the
  /// first entry whose end_tile exceeds t.
  __device__ int find(std::int64_t t, int from) const {
    if (t < entries[from].end_tile) return from;
    int lo = from + 1, hi = count - 1;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (entries[mid].end_tile > t) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }
};

/// Resident blocks per SM the grids are sized for. The kernels' launch bounds keep
/// them within 64 registers a thread, which lets 4 blocks of 256 threads share an SM's
/// 64K registers; their shared memory (at most 4 KB a block) is no limit. -Xptxas -v
/// (nvcc 13.0, sm_90): no spills, except phase 2 of mxfp8_shard.cu (8 bytes).
inline constexpr int kBlocksPerSm = 4;

/// The tiles of block b of G: runs b, b + G, b + 2G, ... of `run` consecutive tiles (a
/// power of two, at most kMaxRun: a plain grid stride when that is 1).
template <int kMaxRun>
struct Walk {
  std::int64_t first;  ///< the block's first tile
  std::int64_t gap;    ///< from the last tile of a run to the first of the block's next
  std::int64_t run;
  __device__ explicit Walk(int run_tiles)
      : first(static_cast<std::int64_t>(blockIdx.x) * run_tiles),
        gap(1 + (static_cast<std::int64_t>(gridDim.x) - 1) * run_tiles),
        run(run_tiles) {}
  /// Whether tile t is the last of its run.
  __device__ bool ends_run(std::int64_t t) const { return kMaxRun == 1 || ((t + 1) & (run - 1)) == 0; }
};

/// Resident blocks on the current device (kBlocksPerSm on every SM; the SM count is
/// cached per device: kernels::device_attribute), so a first launch inside a capture is fine.
inline int resident_blocks() {
  return std::max(1, kernels::device_attribute<cudaDevAttrMultiProcessorCount>()) * kBlocksPerSm;
}

/// The walk of `tiles` tiles with runs of at most max_run tiles: one wave of resident
/// blocks, runs as long as max_run allows while every block still gets one.
struct WalkPlan {
  int grid;
  int run;
};
inline WalkPlan plan_walk(std::int64_t tiles, int max_run) {
  const int resident = resident_blocks();
  int run = 1;
  while (run * 2 <= max_run && std::int64_t{run} * 2 * resident <= tiles) run *= 2;
  return WalkPlan{static_cast<int>(std::min<std::int64_t>((tiles + run - 1) / run, resident)), run};
}

}  // namespace shardopt::mxfp8
