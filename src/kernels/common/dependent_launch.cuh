// dependent_launch.cuh - programmatic dependent launch (PDL, compute capability 9.0 and
// later) for short kernels that follow each other on a stream: the launch helper and the
// two device calls every kernel launched through it makes.
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may be
// scheduled before the grid before it on the stream has finished (once every block of
// that grid has called allow_next_grid or exited), so its launch latency overlaps the
// previous kernel's work. The contract of such a kernel, kept by every user of
// launch_dependent:
// - every thread calls wait_for_previous_grid() before it reads or writes global memory
//   (its inputs, a skip flag, an entry table, an amax slot...; an L2 prefetch, which
//   reads nothing, may come before: prefetch_l2) and before it returns:
//   the wait returns once the previous grid has completed and its writes are visible.
//   Waiting before any return also makes this grid's completion imply the previous
//   one's, which the grid after it relies on (its wait only covers this grid).
// - then it calls allow_next_grid(), so that the next kernel on the stream can be
//   scheduled while this one works; at most two grids of a chain are then resident, the
//   running one and the next one waiting.
// Both calls compile to nothing below sm_90, and the wait returns at once when the grid
// was launched without the attribute (switch off, or a device before sm_90, which
// launch_dependent gives an ordinary launch). Captured in a CUDA graph, the attribute
// becomes a programmatic edge between kernel nodes (CUDA 12.3 and later); the overlap
// only ever applies between two kernels, so after a memset or a copy the launch waits
// as any launch does (test_dependent_launch_gpu.cpp captures both).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/check.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/common/device_attribute.cuh"

namespace shardopt::kernels {

/// Waits until the grid before this one on the stream has completed and its memory
/// writes are visible (griddepcontrol.wait). Every thread calls it first.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Lets the next grid on the stream be scheduled (griddepcontrol.launch_dependents);
/// called after wait_for_previous_grid.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Asks the L2 cache to fetch the line holding `p` (prefetch.global.L2), a hint that
/// changes no value any load returns: L2 is where every write of the device lands, so a
/// line fetched before the previous grid writes it is updated by that write, and L1 is
/// not filled. So a kernel may issue it BEFORE wait_for_previous_grid, for an address of
/// device memory it computed without reading global memory, to overlap its first DRAM
/// round trip with the previous grid's work.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/// Whether the current device has programmatic dependent launch (compute capability 9.0
/// or later; kernels::device_attribute, cached per device).
inline bool device_has_dependent_launch() {
  return device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9;
}

/// Launches `kernel` (which keeps the contract above) with `grid` blocks of `threads`
/// threads on `stream` (any stream, the default one included): as a programmatic
/// dependent launch when the switch is on and the device has it, else an ordinary
/// launch. Error(Cuda) when the launch fails.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), unsigned grid, unsigned threads, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchAttribute attribute[1] = {};
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = dependent_launch() && device_has_dependent_launch() ? 1 : 0;
  SHARDOPT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace shardopt::kernels
