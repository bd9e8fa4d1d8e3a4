#include "core/device_guard.hpp"

#include "core/check.hpp"

namespace shardopt::detail {

#if SHARDOPT_HAVE_CUDA
DeviceGuard::DeviceGuard(int device) {
  if (device < 0) {  // the host backend's "no device": nothing to select or restore
    previous_ = -1;
    return;
  }
  SHARDOPT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) SHARDOPT_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ < 0) return;
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

int current_device() {
  int device = 0;
  SHARDOPT_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}
#else
DeviceGuard::DeviceGuard(int device) { (void)device; }
DeviceGuard::~DeviceGuard() = default;
int current_device() { return -1; }
#endif

}  // namespace shardopt::detail
