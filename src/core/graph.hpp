// graph.hpp - one captured piece of work on either backend: a CUDA graph (captured from
// a stream, instantiated, replayed with one launch) or a HostGraph (recorded from a
// HostStream, replayed in order on the stream it is replayed on).
#pragma once

#include <functional>
#include <optional>

#include "shardopt/backend.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt::detail {

class CapturedGraph {
 public:
  CapturedGraph() = default;
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  /// Captures what `body` enqueues on `stream` (host backend: a HostStream handle, not
  /// nullptr). If `body` throws, the capture is ended and discarded and the error
  /// propagates.
  void capture(Backend backend, Stream stream, const std::function<void()>& body);
  /// Enqueues the captured work on `stream`.
  void replay(Backend backend, Stream stream) const;

 private:
  std::optional<HostGraph> host_;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace shardopt::detail
