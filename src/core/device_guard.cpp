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

std::string make_device_current(int device) {
  const cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) return {};
  return std::string("cudaSetDevice(") + std::to_string(device) + ") failed: " + cudaGetErrorString(err);
}
#else
DeviceGuard::DeviceGuard(int device) { (void)device; }
DeviceGuard::~DeviceGuard() = default;
int current_device() { return -1; }
std::string make_device_current(int device) {
  return "cudaSetDevice(" + std::to_string(device) + "): this build of shardopt has no CUDA";
}
#endif

}  // namespace shardopt::detail
