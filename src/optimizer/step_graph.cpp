#include "shardopt/step_graph.hpp"

#include <utility>

#include "core/graph.hpp"
#include "core/streams.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fsdp.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt {
namespace {

// What StepGraph needs from an optimizer.
struct Target {
  Backend backend = Backend::Host;
  int microbatches = 1;
  bool separate_last = true;  // the last microbatch's graph differs (grad sync)
  bool one_graph = false;
  std::function<void(bool)> set_grad_sync;
  std::function<void(Stream)> advance_microbatch;
  std::function<void(Stream)> step_and_zero;
  std::function<void()> check_capturable;
  std::function<void(Stream)> finish_pending;  // work an eager iteration may leave in flight
  std::function<void(Stream)> join_reductions;  // end of the last microbatch: wait for its reductions
};

}  // namespace

class StepGraph::Impl {
 public:
  Impl(Target t, MicrobatchFn f, StepGraphOptions opts) : target(std::move(t)), fn(std::move(f)), options(opts) {
    SHARDOPT_REQUIRE(fn != nullptr, ErrorCode::InvalidArgument, "StepGraph needs a microbatch function");
    SHARDOPT_REQUIRE(options.warmup_iterations >= 0, ErrorCode::InvalidArgument, "warmup_iterations must be >= 0");
  }

  void microbatch(Stream s, bool last) {
    target.set_grad_sync(last);
    try {
      fn(s, last);
    } catch (...) {
      target.set_grad_sync(true);
      throw;
    }
    target.set_grad_sync(true);
    // The reduce-scatters the last backward started must be joined inside the graph that
    // started them (CUDA capture forbids work left on a forked stream).
    if (last) target.join_reductions(s);
    target.advance_microbatch(s);
  }

  void eager(Stream s) {
    const int k = target.microbatches;
    for (int mb = 0; mb < k; ++mb) microbatch(s, (target.separate_last || target.one_graph) ? mb == k - 1 : false);
    target.step_and_zero(s);
  }

  Target target;
  MicrobatchFn fn;
  StepGraphOptions options;
  std::unique_ptr<detail::CapturedGraph> accumulate, last, step_graph, whole;
};

StepGraph::StepGraph(DistributedAdam& o, MicrobatchFn microbatch, StepGraphOptions options) {
  Target t;
  t.backend = o.backend();
  t.microbatches = o.options().microbatches;
  t.separate_last = o.options().microbatches == 1 || o.options().overlap_grad_reduce;
  t.one_graph = options.one_graph;
  t.set_grad_sync = [&o](bool on) { o.set_grad_sync(on); };
  t.advance_microbatch = [&o](Stream s) { o.advance_microbatch(s); };
  t.step_and_zero = [&o](Stream s) {
    o.step(s);
    o.zero_grad(s);
  };
  t.check_capturable = [&o] { o.check_capturable(); };
  t.finish_pending = [&o](Stream s) {
    for (int b = 0; b < static_cast<int>(o.layout().buckets().size()); ++b) o.wait_param(b, s);
  };
  t.join_reductions = [&o](Stream s) { o.reduce_grads(s); };
  impl_ = std::make_unique<Impl>(std::move(t), std::move(microbatch), options);
}

StepGraph::StepGraph(Fsdp& o, MicrobatchFn microbatch, StepGraphOptions options) {
  Target t;
  t.backend = o.backend();
  t.microbatches = o.options().microbatches;
  t.one_graph = true;
  t.set_grad_sync = [](bool) {};
  t.advance_microbatch = [&o](Stream s) { o.advance_microbatch(s); };
  t.step_and_zero = [&o](Stream s) {
    o.step(s);
    o.zero_grad(s);
  };
  t.check_capturable = [&o] { o.check_capturable(); };
  t.finish_pending = [](Stream) {};
  t.join_reductions = [](Stream) {};
  impl_ = std::make_unique<Impl>(std::move(t), std::move(microbatch), options);
}

StepGraph::~StepGraph() = default;

void StepGraph::run_eager(Stream stream) { impl_->eager(stream); }

void StepGraph::capture(Stream stream) {
  Impl& m = *impl_;
  const Backend be = m.target.backend;
  SHARDOPT_REQUIRE(!captured(), ErrorCode::InvalidState, "StepGraph::capture() was already called");
  {
    // Warm-up on a side stream, ordered after and before the caller's stream.
    SideStream side(be);
    HostStream host_side;
    const Stream ws = be == Backend::Cuda ? side.get() : host_side.handle();
    order_after(be, stream, ws);
    for (int i = 0; i < m.options.warmup_iterations; ++i) m.eager(ws);
    m.target.finish_pending(ws);  // a capture may not wait for work started outside it
    order_after(be, ws, stream);
    synchronize(be, ws);
    synchronize(be, stream);
  }
  m.target.check_capturable();
  if (m.target.one_graph) {
    m.whole = std::make_unique<detail::CapturedGraph>();
    m.whole->capture(be, stream, [&] { m.eager(stream); });
    return;
  }
  const int k = m.target.microbatches;
  if (k > 1) {
    m.accumulate = std::make_unique<detail::CapturedGraph>();
    m.accumulate->capture(be, stream, [&] { m.microbatch(stream, false); });
  }
  if (m.target.separate_last) {
    m.last = std::make_unique<detail::CapturedGraph>();
    m.last->capture(be, stream, [&] { m.microbatch(stream, true); });
  }
  m.step_graph = std::make_unique<detail::CapturedGraph>();
  m.step_graph->capture(be, stream, [&] { m.target.step_and_zero(stream); });
}

void StepGraph::replay(Stream stream) {
  Impl& m = *impl_;
  SHARDOPT_REQUIRE(captured(), ErrorCode::InvalidState, "StepGraph::replay() before capture()");
  const Backend be = m.target.backend;
  if (m.whole) {
    m.whole->replay(be, stream);
    return;
  }
  const int k = m.target.microbatches;
  const int accumulate_replays = m.target.separate_last ? k - 1 : k;
  for (int i = 0; i < accumulate_replays; ++i) m.accumulate->replay(be, stream);
  if (m.target.separate_last) m.last->replay(be, stream);
  m.step_graph->replay(be, stream);
}

void StepGraph::replay_step(Stream stream) {
  SHARDOPT_REQUIRE(impl_->step_graph != nullptr, ErrorCode::InvalidState,
                   "StepGraph::replay_step() needs a captured step graph (not in one-graph mode, after capture())");
  impl_->step_graph->replay(impl_->target.backend, stream);
}

bool StepGraph::captured() const noexcept { return impl_->step_graph != nullptr || impl_->whole != nullptr; }

}  // namespace shardopt
