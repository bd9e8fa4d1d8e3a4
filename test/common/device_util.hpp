// device_util.hpp - test helpers that work on both backends: the one stream of the tests
// (TestStream: a HostStream, or a non-blocking CUDA stream on the current device) with
// graph capture and the Graph a capture ends in, and (from device_copy.hpp) the copies
// between host memory and device memory. Used by the optimizer cases and by the
// communicator and bucket-store cases (test/mpi/comm_test_support.hpp).
#pragma once

#include <memory>

#include "common/device_copy.hpp"
#include "core/check.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

#if SHARDOPT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace shardopt::test {

/// A recorded sequence: a HostGraph or an instantiated CUDA graph (TestStream::end_capture).
class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
#if SHARDOPT_HAVE_CUDA
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
#endif
  }
  /// Enqueues the recorded work on `s` (the host backend runs it now).
  void replay(Backend be, Stream s) {
    if (be == Backend::Host) {
      host_.replay();
      return;
    }
#if SHARDOPT_HAVE_CUDA
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec_, reinterpret_cast<cudaStream_t>(s)));
#else
    (void)s;
#endif
  }

 private:
  friend class TestStream;
  HostGraph host_;
#if SHARDOPT_HAVE_CUDA
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
#endif
};

/// A stream of the backend. The destructor releases a CUDA stream without waiting for it
/// (CUDA still runs what was enqueued, and cudaFree waits for the device): a test that
/// leaves a stream stuck behind a dead peer must not hang in its destructor.
class TestStream {
 public:
  explicit TestStream(Backend b) : backend_(b) {
#if SHARDOPT_HAVE_CUDA
    if (b == Backend::Cuda) {
      SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_, cudaStreamNonBlocking));
      return;
    }
#endif
    host_ = std::make_unique<HostStream>();
  }
  ~TestStream() {
#if SHARDOPT_HAVE_CUDA
    if (cuda_ != nullptr) (void)cudaStreamDestroy(cuda_);
#endif
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;

  /// The library's handle of this stream.
  Stream get() const {
    if (host_ != nullptr) return host_->handle();
#if SHARDOPT_HAVE_CUDA
    return reinterpret_cast<Stream>(cuda_);
#else
    return nullptr;  // not reached: without CUDA every TestStream holds a HostStream
#endif
  }
  /// Waits until everything enqueued on the stream has run.
  void sync() const { synchronize(backend_, get()); }

  /// Starts capturing (CUDA: thread-local capture mode).
  void begin_capture() {
    if (host_ != nullptr) {
      host_->begin_capture();
      return;
    }
#if SHARDOPT_HAVE_CUDA
    SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(cuda_, cudaStreamCaptureModeThreadLocal));
#endif
  }
  /// Ends a capture whose graph is not wanted (nothing is instantiated).
  void end_capture_discard() {
    if (host_ != nullptr) {
      (void)host_->end_capture();
      return;
    }
#if SHARDOPT_HAVE_CUDA
    cudaGraph_t g = nullptr;
    SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(cuda_, &g));
    if (g != nullptr) SHARDOPT_CUDA_CHECK(cudaGraphDestroy(g));
#endif
  }
  /// Ends the capture into `g`, instantiated and ready to replay.
  void end_capture(Graph& g) {
    if (host_ != nullptr) {
      g.host_ = host_->end_capture();
      return;
    }
#if SHARDOPT_HAVE_CUDA
    SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(cuda_, &g.graph_));
    SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&g.exec_, g.graph_, 0));
#endif
  }

 private:
  Backend backend_;
  std::unique_ptr<HostStream> host_;  // every stream but a CUDA one
#if SHARDOPT_HAVE_CUDA
  cudaStream_t cuda_ = nullptr;
#endif
};

}  // namespace shardopt::test
