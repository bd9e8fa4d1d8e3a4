// cuda_ops.hpp - the CUDA runtime calls of the test helpers (device_copy.hpp,
// device_util.hpp) behind one seam: cuda_ops.cpp in a CUDA build, cuda_ops_none.cpp
// without (each call Error(Unsupported); a build without CUDA has no Backend::Cuda to make
// them with). Only the helpers call these.
#pragma once

#include <cstddef>

#include "shardopt/backend.hpp"

namespace shardopt::test::cuda {

/// Waits for all device work, copies `bytes` (cudaMemcpyDefault: either direction), and
/// waits until the copy has landed.
void copy_landed(void* dst, const void* src, std::size_t bytes);

/// A new non-blocking stream on the current device, and its release (not waiting for it).
Stream create_stream();
void destroy_stream(Stream stream) noexcept;

/// An instantiated graph: the captured cudaGraph_t and its cudaGraphExec_t.
struct GraphHandles {
  void* graph = nullptr;
  void* exec = nullptr;
};

/// Starts a thread-local capture on `stream`.
void begin_capture(Stream stream);
/// Ends the capture on `stream` and destroys what it recorded.
void end_capture_discard(Stream stream);
/// Ends the capture on `stream` into an instantiated graph.
GraphHandles end_capture(Stream stream);
/// Enqueues `g` on `stream`.
void launch(const GraphHandles& g, Stream stream);
/// Destroys `g` (its handles may be null).
void destroy(GraphHandles& g) noexcept;

}  // namespace shardopt::test::cuda
