#include "shardopt/backend.hpp"

#include <cstdlib>
#include <string>

#include "core/check.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt {

const char* to_string(Backend b) noexcept { return b == Backend::Cuda ? "cuda" : "host"; }

bool cuda_compiled() noexcept { return SHARDOPT_HAVE_CUDA != 0; }
bool nccl_compiled() noexcept { return SHARDOPT_HAVE_NCCL != 0; }
bool mpi_compiled() noexcept { return SHARDOPT_HAVE_MPI != 0; }

int cuda_device_count() noexcept {
#if SHARDOPT_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

Backend default_backend() {
  if (const char* env = std::getenv("SHARDOPT_BACKEND"); env != nullptr && env[0] != '\0') {
    const std::string v(env);
    if (v == "host") return Backend::Host;
    if (v == "cuda") {
      SHARDOPT_REQUIRE(cuda_device_count() > 0, ErrorCode::Unsupported,
                       "SHARDOPT_BACKEND=cuda but no CUDA device is usable in this build/process; "
                       "unset it or set SHARDOPT_BACKEND=host");
      return Backend::Cuda;
    }
    SHARDOPT_REQUIRE(false, ErrorCode::InvalidArgument,
                     "SHARDOPT_BACKEND='" + v + "' is not one of: host, cuda");
  }
  return cuda_device_count() > 0 ? Backend::Cuda : Backend::Host;
}

bool is_capturing(Backend backend, Stream stream) {
  if (backend == Backend::Host) {
    const HostStream* hs = HostStream::from(stream);
    return hs != nullptr && hs->capturing();
  }
#if SHARDOPT_HAVE_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SHARDOPT_CUDA_CHECK(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
#else
  SHARDOPT_REQUIRE(false, ErrorCode::Unsupported, "this build has no CUDA backend");
#endif
}

void synchronize(Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(!is_capturing(backend, stream), ErrorCode::InvalidState,
                   "synchronize() on a stream that is being captured; end the capture first");
  if (backend == Backend::Host) return;
#if SHARDOPT_HAVE_CUDA
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
#endif
}

}  // namespace shardopt
