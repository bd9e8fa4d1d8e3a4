#include "shardopt/step_graph.hpp"

#include <optional>
#include <utility>

#include "core/check.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt {
namespace {

// One captured piece of work on either backend.
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

  template <class Fn>
  void capture(Backend backend, Stream stream, Fn&& body) {
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
    SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(s, &graph_));
    SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
#else
    SHARDOPT_REQUIRE(false, ErrorCode::Unsupported, "this build has no CUDA backend");
#endif
  }

  void replay(Backend backend, Stream stream) const {
    if (backend == Backend::Host) {
      host_enqueue(stream, [this] { host_->replay(); });
      return;
    }
#if SHARDOPT_HAVE_CUDA
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec_, reinterpret_cast<cudaStream_t>(stream)));
#endif
  }

 private:
  std::optional<HostGraph> host_;
#if SHARDOPT_HAVE_CUDA
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
#endif
};

// A side stream for the warm-up, ordered after and before the caller's stream.
class SideStream {
 public:
  explicit SideStream(Backend backend) : backend_(backend) {
#if SHARDOPT_HAVE_CUDA
    if (backend_ == Backend::Cuda) SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_, cudaStreamNonBlocking));
#endif
  }
  ~SideStream() {
#if SHARDOPT_HAVE_CUDA
    if (cuda_ != nullptr) (void)cudaStreamDestroy(cuda_);
#endif
  }
  Stream handle() const {
#if SHARDOPT_HAVE_CUDA
    if (backend_ == Backend::Cuda) return reinterpret_cast<Stream>(cuda_);
#endif
    return host_.handle();
  }
  // `to` waits for everything queued on `from`.
  void order(Stream from, Stream to) const {
#if SHARDOPT_HAVE_CUDA
    if (backend_ == Backend::Cuda) {
      cudaEvent_t ev = nullptr;
      SHARDOPT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      SHARDOPT_CUDA_CHECK(cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(from)));
      SHARDOPT_CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(to), ev, 0));
      SHARDOPT_CUDA_CHECK(cudaEventDestroy(ev));
    }
#endif
    (void)from;
    (void)to;
  }

 private:
  Backend backend_;
  HostStream host_;
#if SHARDOPT_HAVE_CUDA
  cudaStream_t cuda_ = nullptr;
#endif
};

}  // namespace

class StepGraph::Impl {
 public:
  Impl(DistributedAdam& o, MicrobatchFn f, StepGraphOptions opts) : opt(o), fn(std::move(f)), options(opts) {
    SHARDOPT_REQUIRE(fn != nullptr, ErrorCode::InvalidArgument, "StepGraph needs a microbatch function");
    SHARDOPT_REQUIRE(options.warmup_iterations >= 0, ErrorCode::InvalidArgument, "warmup_iterations must be >= 0");
  }

  int microbatches() const { return opt.options().microbatches; }
  bool separate_last() const { return microbatches() == 1 || opt.options().overlap_grad_reduce; }

  void microbatch(Stream s, bool last) {
    opt.set_grad_sync(last);
    try {
      fn(s, last);
    } catch (...) {
      opt.set_grad_sync(true);
      throw;
    }
    opt.set_grad_sync(true);
    opt.advance_microbatch(s);
  }

  void step(Stream s) {
    opt.step(s);
    opt.zero_grad(s);
  }

  void eager(Stream s) {
    const int k = microbatches();
    for (int mb = 0; mb < k; ++mb) microbatch(s, separate_last() && mb == k - 1);
    step(s);
  }

  DistributedAdam& opt;
  MicrobatchFn fn;
  StepGraphOptions options;
  std::unique_ptr<Graph> accumulate, last, step_graph;
};

StepGraph::StepGraph(DistributedAdam& optimizer, MicrobatchFn microbatch, StepGraphOptions options)
    : impl_(std::make_unique<Impl>(optimizer, std::move(microbatch), options)) {}

StepGraph::~StepGraph() = default;

void StepGraph::run_eager(Stream stream) { impl_->eager(stream); }

void StepGraph::capture(Stream stream) {
  Impl& m = *impl_;
  const Backend be = m.opt.backend();
  SHARDOPT_REQUIRE(!captured(), ErrorCode::InvalidState, "StepGraph::capture() was already called");
  {
    SideStream side(be);
    side.order(stream, side.handle());
    for (int i = 0; i < m.options.warmup_iterations; ++i) m.eager(side.handle());
    side.order(side.handle(), stream);
    synchronize(be, stream);
    if (be == Backend::Cuda) synchronize(be, side.handle());
  }
  m.opt.check_capturable();
  const int k = m.microbatches();
  if (k > 1) {
    m.accumulate = std::make_unique<Graph>();
    m.accumulate->capture(be, stream, [&] { m.microbatch(stream, false); });
  }
  if (m.separate_last()) {
    m.last = std::make_unique<Graph>();
    m.last->capture(be, stream, [&] { m.microbatch(stream, true); });
  }
  m.step_graph = std::make_unique<Graph>();
  m.step_graph->capture(be, stream, [&] { m.step(stream); });
}

void StepGraph::replay(Stream stream) {
  Impl& m = *impl_;
  SHARDOPT_REQUIRE(captured(), ErrorCode::InvalidState, "StepGraph::replay() before capture()");
  const Backend be = m.opt.backend();
  const int k = m.microbatches();
  const int accumulate_replays = m.separate_last() ? k - 1 : k;
  for (int i = 0; i < accumulate_replays; ++i) m.accumulate->replay(be, stream);
  if (m.separate_last()) m.last->replay(be, stream);
  m.step_graph->replay(be, stream);
}

void StepGraph::replay_step(Stream stream) {
  SHARDOPT_REQUIRE(captured(), ErrorCode::InvalidState, "StepGraph::replay_step() before capture()");
  impl_->step_graph->replay(impl_->opt.backend(), stream);
}

bool StepGraph::captured() const noexcept { return impl_->step_graph != nullptr; }

}  // namespace shardopt
