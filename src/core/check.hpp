// check.hpp - one check macro each for CUDA, NCCL and MPI. A failing call throws
// shardopt::Error carrying the call's text, the library's message for the code, the
// file and the line. And the one way to say "this build has no CUDA" (no_cuda).
#pragma once

#include <string>

#include "shardopt/error.hpp"
#include "shardopt_config.h"

namespace shardopt::detail {
/// Throws Error(Unsupported): `what` (e.g. "fused Adam") was asked for on Backend::Cuda
/// in a build of shardopt without CUDA.
[[noreturn]] inline void no_cuda(const char* what) {
  throw Error(ErrorCode::Unsupported, std::string(what) +
                                          " on Backend::Cuda needs a CUDA build of shardopt; rebuild with "
                                          "-Dcuda=enabled or use Backend::Host");
}
}  // namespace shardopt::detail

#if SHARDOPT_HAVE_CUDA
#include <cuda_runtime.h>
namespace shardopt::detail {
[[noreturn]] inline void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear the recorded error so that later launch checks do not report it again
  std::string msg = std::string("CUDA call `") + call + "` failed: " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation)
    msg += "; the device is out of memory: lower the bucket size, the model size or the batch";
  throw_error(ErrorCode::Cuda, msg, file, line);
}
}  // namespace shardopt::detail
#define SHARDOPT_CUDA_CHECK(call)                                                     \
  do {                                                                                \
    const cudaError_t so_err_ = (call);                                               \
    if (so_err_ != cudaSuccess) ::shardopt::detail::throw_cuda(so_err_, #call, __FILE__, __LINE__); \
  } while (0)
#endif

#if SHARDOPT_HAVE_NCCL
#include <nccl.h>
namespace shardopt::detail {
[[noreturn]] inline void throw_nccl(ncclResult_t res, const char* call, const char* file, int line) {
  std::string msg = std::string("NCCL call `") + call + "` failed: " + ncclGetErrorString(res);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  msg += "; run with NCCL_DEBUG=WARN for NCCL's own report";
  throw_error(ErrorCode::Nccl, msg, file, line);
}
}  // namespace shardopt::detail
#define SHARDOPT_NCCL_CHECK(call)                                                     \
  do {                                                                                \
    const ncclResult_t so_res_ = (call);                                              \
    if (so_res_ != ncclSuccess) ::shardopt::detail::throw_nccl(so_res_, #call, __FILE__, __LINE__); \
  } while (0)
#endif

#if SHARDOPT_HAVE_MPI
#include <mpi.h>
namespace shardopt::detail {
[[noreturn]] inline void throw_mpi(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw_error(ErrorCode::Mpi,
              std::string("MPI call `") + call + "` failed: " + std::string(text, static_cast<size_t>(len)),
              file, line);
}
}  // namespace shardopt::detail
#define SHARDOPT_MPI_CHECK(call)                                                      \
  do {                                                                                \
    const int so_code_ = (call);                                                      \
    if (so_code_ != MPI_SUCCESS) ::shardopt::detail::throw_mpi(so_code_, #call, __FILE__, __LINE__); \
  } while (0)
#endif
