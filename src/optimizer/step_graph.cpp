#include "shardopt/step_graph.hpp"

#include <string>
#include <utility>

#include "comm/deadline.hpp"
#include "core/graph.hpp"
#include "core/live.hpp"
#include "core/trace.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fsdp.hpp"
#include "optimizer/replay_watch.hpp"
#include "optimizer/step_target.hpp"

namespace shardopt {

class StepGraph::Impl {
 public:
  Impl(detail::StepTarget& t, MicrobatchFn f, StepGraphOptions opts, const char* optimizer)
      : target(t),
        fn(std::move(f)),
        options(opts),
        watch(t.step_comm(), optimizer),
        one_graph(opts.one_graph || t.whole_iteration_only()) {
    SHARDOPT_REQUIRE(fn != nullptr, ErrorCode::InvalidArgument, "StepGraph needs a microbatch function");
    SHARDOPT_REQUIRE(options.warmup_iterations >= 0, ErrorCode::InvalidArgument, "warmup_iterations must be >= 0");
  }

  void microbatch(Stream s, bool last) {
    target.set_iteration_grad_sync(last);
    try {
      fn(s, last);
    } catch (...) {
      target.set_iteration_grad_sync(true);
      throw;
    }
    target.set_iteration_grad_sync(true);
    // The reduce-scatters the last backward started must be joined inside the graph that
    // started them (CUDA capture forbids work left on a forked stream).
    if (last) target.join_reductions(s);
    target.advance_iteration_microbatch(s);
  }

  void eager(Stream s) {
    const int k = target.iteration_microbatches();
    const bool separate_last = target.separate_last_microbatch() || one_graph;
    for (int mb = 0; mb < k; ++mb) microbatch(s, separate_last ? mb == k - 1 : false);
    target.step_and_zero_grad(s);
  }

  // The optimizer's Impl: it stays where it is when the optimizer object is moved.
  detail::StepTarget& target;
  MicrobatchFn fn;
  StepGraphOptions options;
  // The step watchdog: CUDA replays are watched against step_timeout by its thread.
  // Declared before the graphs so that they are destroyed first: after a failure NCCL's
  // abort waits for the graphs that hold the communicator, and the watch's copy of the
  // communicator may be the last one.
  detail::ReplayWatch watch;
  bool one_graph;
  std::unique_ptr<detail::CapturedGraph> accumulate, last, step_graph, whole;

  // Runs `launch` (the graph launches of one replay) under the watchdog: refused once the
  // communicator has failed; host backend: every wait inside bounded by step_timeout;
  // CUDA: watched from the launch on (the captured graphs count their completion).
  template <class Launch>
  void watched(const char* call, Launch&& launch) {
    watch.before_replay();
    if (target.step_backend() == Backend::Host) {
      detail::StepDeadlineScope scope(target.step_comm().watchdog().step_timeout,
                                      std::string(call) + " of iteration #" + std::to_string(watch.next_number()));
      launch();
    } else {
      launch();
    }
    watch.after_replay();
  }
};

namespace {
StepGraph::Impl& live(const std::unique_ptr<StepGraph::Impl>& impl) {
  return detail::live(impl, "StepGraph");
}
}  // namespace

StepGraph::StepGraph(DistributedAdam& o, MicrobatchFn microbatch, StepGraphOptions options)
    : impl_(std::make_unique<Impl>(o.step_target(), std::move(microbatch), options, "DistributedAdam")) {}

StepGraph::StepGraph(Fsdp& o, MicrobatchFn microbatch, StepGraphOptions options)
    : impl_(std::make_unique<Impl>(o.step_target(), std::move(microbatch), options, "Fsdp")) {}

StepGraph::~StepGraph() = default;
StepGraph::StepGraph(StepGraph&&) noexcept = default;
StepGraph& StepGraph::operator=(StepGraph&&) noexcept = default;

void StepGraph::run_eager(Stream stream) { live(impl_).eager(stream); }

void StepGraph::capture(Stream stream) {
  Impl& m = live(impl_);
  SHARDOPT_TRACE("shardopt/capture");
  const Backend be = m.target.step_backend();
  SHARDOPT_REQUIRE(!captured(), ErrorCode::InvalidState, "StepGraph::capture() was already called");
  // Warm-up on the caller's stream itself, so that the microbatch function is handed
  // `stream` in every call, warm-up and capture alike: a trainer that enqueues on the
  // stream it passed here instead of the one it is handed is ordered either way.
  // Nothing needs a stream of its own here (docs/decisions.md, issue 30).
  for (int i = 0; i < m.options.warmup_iterations; ++i) m.eager(stream);
  m.target.finish_pending(stream);  // a capture may not wait for work started outside it
  synchronize(be, stream);
  m.target.check_step_capturable();
  if (m.one_graph) {
    m.whole = std::make_unique<detail::CapturedGraph>();
    m.whole->capture(be, stream, [&] {
      m.eager(stream);
      m.watch.mark_completion(stream);  // the iteration's last work: counts it complete
    });
    return;
  }
  const int k = m.target.iteration_microbatches();
  const bool separate_last = m.target.separate_last_microbatch();
  if (k > 1) {
    m.accumulate = std::make_unique<detail::CapturedGraph>();
    m.accumulate->capture(be, stream, [&] { m.microbatch(stream, false); });
  }
  if (separate_last) {
    m.last = std::make_unique<detail::CapturedGraph>();
    m.last->capture(be, stream, [&] { m.microbatch(stream, true); });
  }
  m.step_graph = std::make_unique<detail::CapturedGraph>();
  m.step_graph->capture(be, stream, [&] {
    m.target.step_and_zero_grad(stream);
    m.watch.mark_completion(stream);  // the iteration's last work: counts it complete
  });
}

void StepGraph::replay(Stream stream) {
  Impl& m = live(impl_);
  SHARDOPT_TRACE("shardopt/replay");
  SHARDOPT_REQUIRE(captured(), ErrorCode::InvalidState, "StepGraph::replay() before capture()");
  const Backend be = m.target.step_backend();
  m.watched("StepGraph::replay", [&] {
    if (m.whole) {
      m.whole->replay(be, stream);
      return;
    }
    const int k = m.target.iteration_microbatches();
    const bool separate_last = m.target.separate_last_microbatch();
    const int accumulate_replays = separate_last ? k - 1 : k;
    for (int i = 0; i < accumulate_replays; ++i) m.accumulate->replay(be, stream);
    if (separate_last) m.last->replay(be, stream);
    m.step_graph->replay(be, stream);
  });
}

void StepGraph::replay_step(Stream stream) {
  Impl& m = live(impl_);
  SHARDOPT_TRACE("shardopt/replay_step");
  SHARDOPT_REQUIRE(m.step_graph != nullptr, ErrorCode::InvalidState,
                   "StepGraph::replay_step() needs a captured step graph (not in one-graph mode, after capture())");
  m.watched("StepGraph::replay_step", [&] { m.step_graph->replay(m.target.step_backend(), stream); });
}

bool StepGraph::captured() const {
  const Impl& m = live(impl_);
  return m.step_graph != nullptr || m.whole != nullptr;
}

}  // namespace shardopt
