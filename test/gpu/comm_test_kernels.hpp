// comm_test_kernels.hpp - small kernels of the communicator GPU tests: delays that make
// a missing stream dependency visible as wrong data.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardopt::test {

/// On `stream`: waits `ns` nanoseconds of GPU time (%globaltimer), then writes
/// `pattern` (the low `element_bytes` bytes: 2 or 4) to `count` elements of `data`.
void spin_then_fill(cudaStream_t stream, std::uint64_t ns, void* data, long long count, int element_bytes,
                    std::uint32_t pattern);

/// On `stream`: waits `ns` nanoseconds of GPU time.
void spin(cudaStream_t stream, std::uint64_t ns);

/// On `stream`: a kernel that spins until the host writes nonzero into `*flag` (mapped
/// pinned memory, HostFlag) or `max_ns` of GPU time have passed (a safety bound, so that
/// a failing test cannot leave a kernel running forever). A stream that never finishes.
void spin_until_flag(cudaStream_t stream, const volatile int* flag, std::uint64_t max_ns);

/// One int of mapped pinned host memory that a kernel can poll (spin_until_flag).
class HostFlag {
 public:
  HostFlag();
  ~HostFlag();
  HostFlag(const HostFlag&) = delete;
  HostFlag& operator=(const HostFlag&) = delete;
  /// The address kernels read.
  const volatile int* device() const noexcept { return device_; }
  /// Releases the kernels spinning on it.
  void set() noexcept { *host_ = 1; }

 private:
  volatile int* host_ = nullptr;
  const volatile int* device_ = nullptr;
};

}  // namespace shardopt::test
