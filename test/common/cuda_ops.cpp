// cuda_ops.cpp - cuda_ops.hpp in a CUDA build: the runtime calls themselves.
#include "common/cuda_ops.hpp"

#include <cuda_runtime.h>

#include "core/check.hpp"

namespace shardopt::test::cuda {
namespace {
cudaStream_t raw(Stream s) { return reinterpret_cast<cudaStream_t>(s); }
}  // namespace

void copy_landed(void* dst, const void* src, std::size_t bytes) {
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  SHARDOPT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
}

Stream create_stream() {
  cudaStream_t s = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return reinterpret_cast<Stream>(s);
}

void destroy_stream(Stream stream) noexcept {
  if (stream != nullptr) (void)cudaStreamDestroy(raw(stream));
}

void begin_capture(Stream stream) {
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(raw(stream), cudaStreamCaptureModeThreadLocal));
}

void end_capture_discard(Stream stream) {
  cudaGraph_t g = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(raw(stream), &g));
  if (g != nullptr) SHARDOPT_CUDA_CHECK(cudaGraphDestroy(g));
}

GraphHandles end_capture(Stream stream) {
  cudaGraph_t g = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(raw(stream), &g));
  GraphHandles h;
  h.graph = g;
  cudaGraphExec_t e = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
  if (err != cudaSuccess) {
    destroy(h);
    SHARDOPT_CUDA_CHECK(err);
  }
  h.exec = e;
  return h;
}

void launch(const GraphHandles& g, Stream stream) {
  SHARDOPT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g.exec), raw(stream)));
}

void destroy(GraphHandles& g) noexcept {
  if (g.exec != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g.exec));
  if (g.graph != nullptr) (void)cudaGraphDestroy(static_cast<cudaGraph_t>(g.graph));
  g = GraphHandles{};
}

}  // namespace shardopt::test::cuda
