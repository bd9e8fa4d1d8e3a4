// device_util.hpp - test helpers that work on both backends: a stream, and (from
// device_copy.hpp) the copies between host memory and device memory.
#pragma once

#include "common/device_copy.hpp"
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

}  // namespace shardopt::test
