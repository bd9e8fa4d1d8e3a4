// cuda_ops_none.cpp - cuda_ops.hpp in a build without CUDA: every call refuses (none is
// reached, since no Backend::Cuda exists there); the releases have nothing to release.
#include "common/cuda_ops.hpp"

#include "core/check.hpp"

namespace shardopt::test::cuda {

void copy_landed(void*, const void*, std::size_t) { detail::no_cuda("a test copy"); }
Stream create_stream() { detail::no_cuda("a test stream"); }
void destroy_stream(Stream) noexcept {}
void begin_capture(Stream) { detail::no_cuda("a test capture"); }
void end_capture_discard(Stream) { detail::no_cuda("a test capture"); }
GraphHandles end_capture(Stream) { detail::no_cuda("a test capture"); }
void launch(const GraphHandles&, Stream) { detail::no_cuda("a test graph"); }
void destroy(GraphHandles& g) noexcept { g = GraphHandles{}; }

}  // namespace shardopt::test::cuda
