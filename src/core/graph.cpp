#include "core/graph.hpp"

#include "core/check.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

CapturedGraph::~CapturedGraph() {
#if SHARDOPT_HAVE_CUDA
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) (void)cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
#endif
}

void CapturedGraph::capture(Backend backend, Stream stream, const std::function<void()>& body) {
  if (backend == Backend::Host) {
    HostStream* hs = HostStream::from(stream);
    SHARDOPT_REQUIRE(hs != nullptr, ErrorCode::InvalidArgument,
                     "host-backend capture needs a HostStream handle, not the null stream");
    hs->begin_capture();
    try {
      body();
    } catch (...) {
      (void)hs->end_capture();
      throw;
    }
    host_ = hs->end_capture();
    return;
  }
#if SHARDOPT_HAVE_CUDA
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(s, &broken);
    if (broken != nullptr) (void)cudaGraphDestroy(broken);
    throw;
  }
  cudaGraph_t graph = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
#else
  (void)stream;
  (void)body;
  no_cuda("graph capture");
#endif
}

void CapturedGraph::replay(Backend backend, Stream stream) const {
  if (backend == Backend::Host) {
    host_enqueue(stream, [this] { host_->replay(); });
    return;
  }
#if SHARDOPT_HAVE_CUDA
  SHARDOPT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), reinterpret_cast<cudaStream_t>(stream)));
#else
  (void)stream;
#endif
}

}  // namespace shardopt::detail
