// shardopt/host_stream.hpp - streams and graph capture for the host backend.
//
// A HostStream is the host backend's stand-in for a CUDA stream: work enqueued on it
// runs at once, in order, unless the stream is capturing; then the work is recorded
// into a HostGraph, exactly as CUDA stream capture records kernels into a graph
// instead of running them. Replaying the graph runs the recorded work again with the
// arguments it was recorded with. This lets the graph-capture contract (no host reads
// of device data, no per-step host values frozen at capture) be tested without a GPU.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "shardopt/backend.hpp"

namespace shardopt {

/// Work recorded from a capturing HostStream; replay() runs it in recorded order.
class HostGraph {
 public:
  HostGraph() = default;
  /// Runs every recorded operation once, in order.
  void replay() const;
  /// Number of recorded operations.
  std::size_t size() const noexcept { return ops_.size(); }

 private:
  friend class HostStream;
  std::vector<std::function<void()>> ops_;
};

/// An ordered queue of host work that can be captured into a HostGraph.
class HostStream {
 public:
  HostStream();
  ~HostStream();
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  /// The handle to pass where shardopt takes a Stream.
  Stream handle() const noexcept;
  /// Starts recording; throws Error(InvalidState) if already capturing.
  void begin_capture();
  /// Stops recording and returns the graph; throws Error(InvalidState) if not capturing.
  HostGraph end_capture();
  /// True between begin_capture() and end_capture().
  bool capturing() const noexcept { return capturing_; }

  /// The HostStream behind a handle; nullptr for a null handle. Throws
  /// Error(InvalidArgument) for a handle that is not a live HostStream (for example a
  /// cudaStream_t passed to a host-backend object).
  static HostStream* from(Stream stream);

 private:
  friend void host_enqueue(Stream stream, std::function<void()> op);
  bool capturing_ = false;
  std::vector<std::function<void()>> recorded_;
};

/// Runs `op` now, or records it when `stream` is a capturing HostStream. The host
/// backend's kernels, copies and collectives all go through this; a trainer running
/// on the host backend enqueues its own compute here too, so that it joins a capture.
void host_enqueue(Stream stream, std::function<void()> op);

}  // namespace shardopt
