// device_util.hpp - test helpers that work on both backends: the one stream of the tests
// (TestStream: a HostStream, or a non-blocking CUDA stream on the current device) with
// graph capture and the Graph a capture ends in, and (from device_copy.hpp) the copies
// between host memory and device memory. Used by the optimizer cases and by the
// communicator and bucket-store cases (test/mpi/comm_test_support.hpp). The CUDA calls
// go through cuda_ops.hpp.
#pragma once

#include <memory>

#include "common/cuda_ops.hpp"
#include "common/device_copy.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt::test {

/// A recorded sequence: a HostGraph or an instantiated CUDA graph (TestStream::end_capture).
class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() { cuda::destroy(cuda_); }
  /// Enqueues the recorded work on `s` (the host backend runs it now).
  void replay(Backend be, Stream s) {
    if (be == Backend::Host) {
      host_.replay();
      return;
    }
    cuda::launch(cuda_, s);
  }

 private:
  friend class TestStream;
  HostGraph host_;
  cuda::GraphHandles cuda_;
};

/// A stream of the backend. The destructor releases a CUDA stream without waiting for it
/// (CUDA still runs what was enqueued, and cudaFree waits for the device): a test that
/// leaves a stream stuck behind a dead peer must not hang in its destructor.
class TestStream {
 public:
  explicit TestStream(Backend b) : backend_(b) {
    if (b == Backend::Cuda) {
      cuda_ = cuda::create_stream();
      return;
    }
    host_ = std::make_unique<HostStream>();
  }
  ~TestStream() { cuda::destroy_stream(cuda_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;

  /// The library's handle of this stream.
  Stream get() const { return host_ != nullptr ? host_->handle() : cuda_; }
  /// Waits until everything enqueued on the stream has run.
  void sync() const { synchronize(backend_, get()); }

  /// Starts capturing (CUDA: thread-local capture mode).
  void begin_capture() {
    if (host_ != nullptr) {
      host_->begin_capture();
      return;
    }
    cuda::begin_capture(cuda_);
  }
  /// Ends a capture whose graph is not wanted (nothing is instantiated).
  void end_capture_discard() {
    if (host_ != nullptr) {
      (void)host_->end_capture();
      return;
    }
    cuda::end_capture_discard(cuda_);
  }
  /// Ends the capture into `g`, instantiated and ready to replay.
  void end_capture(Graph& g) {
    if (host_ != nullptr) {
      g.host_ = host_->end_capture();
      return;
    }
    cuda::destroy(g.cuda_);
    g.cuda_ = cuda::end_capture(cuda_);
  }

 private:
  Backend backend_;
  std::unique_ptr<HostStream> host_;  // every stream but a CUDA one
  Stream cuda_ = nullptr;
};

}  // namespace shardopt::test
