// device_guard.hpp - makes a CUDA device current for a scope and restores the previous
// one (NCCL calls and allocations must run on the communicator's device).
#pragma once

#include "core/check.hpp"

#if SHARDOPT_HAVE_CUDA
namespace shardopt::detail {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    SHARDOPT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) SHARDOPT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace shardopt::detail
#endif
