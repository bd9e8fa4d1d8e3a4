// shardopt/backend.hpp - where the work runs: CUDA devices, or the host backend.
//
// Every asynchronous call of shardopt takes a Stream. On the CUDA backend a Stream is
// a cudaStream_t (the two types are the same pointer type, so a trainer passes its
// cudaStream_t directly). On the host backend a Stream is the handle of a HostStream
// (shardopt/host_stream.hpp) or nullptr, which runs the work at once.
#pragma once

struct CUstream_st;

namespace shardopt {

/// A stream handle: cudaStream_t on the CUDA backend, HostStream::handle() on the host.
using Stream = CUstream_st*;

/// The execution backend of a communicator, an optimizer and their buffers.
enum class Backend {
  Cuda,  ///< device memory, CUDA kernels, NCCL
  Host,  ///< aligned host memory, host twins of the kernels, MPI
};

/// "cuda" or "host".
const char* to_string(Backend b) noexcept;

/// True when this build contains the CUDA backend.
bool cuda_compiled() noexcept;
/// True when this build contains the NCCL communicator.
bool nccl_compiled() noexcept;
/// True when this build contains MPI support.
bool mpi_compiled() noexcept;

/// Number of CUDA devices visible to this process (0 without CUDA or a driver).
int cuda_device_count() noexcept;

/// Backend::Cuda when the build has CUDA and a device is visible, else Backend::Host.
/// The environment variable SHARDOPT_BACKEND=host|cuda overrides the choice
/// (asking for cuda without a device throws Error(Unsupported)).
Backend default_backend();

/// True when `stream` is being captured (a CUDA graph, or a HostStream capture).
bool is_capturing(Backend backend, Stream stream);

/// Waits until all work queued on `stream` has finished (host backend: nothing to wait
/// for). Throws Error(InvalidState) while the stream is being captured.
void synchronize(Backend backend, Stream stream);

}  // namespace shardopt
