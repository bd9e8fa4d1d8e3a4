// device_attribute.cuh - an attribute of the current CUDA device, queried once per device
// and cached: what the launch helpers size their grids by (SM count) or decide a launch
// by (compute capability). A device query, no stream work, so a first call inside a
// stream capture is fine.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>

#include "core/check.hpp"

namespace shardopt::kernels {

/// cudaDeviceGetAttribute(kAttr) of the current device, cached per device (the first 64
/// devices; others are queried each time).
template <cudaDeviceAttr kAttr>
inline int device_attribute() {
  static std::array<std::atomic<int>, 64> cache{};  // value + 1; 0: not yet known
  int device = 0;
  SHARDOPT_CUDA_CHECK(cudaGetDevice(&device));
  const bool cached = device >= 0 && device < static_cast<int>(cache.size());
  if (cached) {
    const int known = cache[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
    if (known != 0) return known - 1;
  }
  int value = 0;
  SHARDOPT_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttr, device));
  if (cached) cache[static_cast<std::size_t>(device)].store(value + 1, std::memory_order_relaxed);
  return value;
}

}  // namespace shardopt::kernels
