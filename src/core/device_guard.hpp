// device_guard.hpp - makes a CUDA device current for a scope and restores the previous
// one (NCCL calls, allocations and stream work must run on the communicator's device).
// In a build without CUDA it does nothing, so callers need no #if.
#pragma once

#include <string>

namespace shardopt::detail {

class DeviceGuard {
 public:
  /// Makes `device` current (Error(Cuda) if that fails); no-op without CUDA, and for a
  /// negative device (the host backend's communicators carry -1).
  explicit DeviceGuard(int device);
  /// Restores the device that was current before (never throws).
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

/// The calling thread's current CUDA device (Error(Cuda) if the query fails); -1 in a
/// build without CUDA.
int current_device();

/// Makes `device` the calling thread's current CUDA device for good (no restore), for a
/// caller that must tell the other ranks before it throws: "" when it worked, else why not
/// ("cudaSetDevice(d) failed: ..."). A build without CUDA answers that it has no CUDA.
std::string make_device_current(int device);

}  // namespace shardopt::detail
