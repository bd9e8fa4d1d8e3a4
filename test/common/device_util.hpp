// device_util.hpp - test helpers that work on both backends: a stream, and copies
// between test vectors and device (or host-backend) memory.
#pragma once

#include <cstring>
#include <vector>

#include "core/check.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt::test {

/// A stream of the backend: a HostStream, or a non-blocking cudaStream_t.
class TestStream {
 public:
  explicit TestStream(Backend b) : backend_(b) {
#if SHARDOPT_HAVE_CUDA
    if (b == Backend::Cuda) SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_, cudaStreamNonBlocking));
#endif
  }
  ~TestStream() {
#if SHARDOPT_HAVE_CUDA
    if (cuda_ != nullptr) (void)cudaStreamDestroy(cuda_);
#endif
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  Stream get() const {
#if SHARDOPT_HAVE_CUDA
    if (backend_ == Backend::Cuda) return reinterpret_cast<Stream>(cuda_);
#endif
    return host_.handle();
  }
  void sync() const { synchronize(backend_, get()); }

 private:
  Backend backend_;
  HostStream host_;
#if SHARDOPT_HAVE_CUDA
  cudaStream_t cuda_ = nullptr;
#endif
};

/// Copies `bytes` of device memory into a vector (synchronous).
template <class T>
std::vector<T> to_host(Backend b, const void* src, std::size_t count) {
  std::vector<T> out(count);
  if (count == 0) return out;
  if (b == Backend::Host) {
    std::memcpy(out.data(), src, count * sizeof(T));
    return out;
  }
#if SHARDOPT_HAVE_CUDA
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  SHARDOPT_CUDA_CHECK(cudaMemcpy(out.data(), src, count * sizeof(T), cudaMemcpyDefault));
#endif
  return out;
}

/// Copies a vector into device memory (synchronous).
template <class T>
void from_host(Backend b, void* dst, const std::vector<T>& v) {
  if (v.empty()) return;
  if (b == Backend::Host) {
    std::memcpy(dst, v.data(), v.size() * sizeof(T));
    return;
  }
#if SHARDOPT_HAVE_CUDA
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  SHARDOPT_CUDA_CHECK(cudaMemcpy(dst, v.data(), v.size() * sizeof(T), cudaMemcpyDefault));
  // A pageable host -> device cudaMemcpy may return before its DMA lands, and the work
  // that reads the bytes runs on non-blocking streams: wait for the copy.
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

}  // namespace shardopt::test
