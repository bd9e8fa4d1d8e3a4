// shardopt/step_graph.hpp - capture a training iteration once, replay it every step.
//
// An iteration is: for each microbatch, the trainer's forward+backward followed by the
// device-side microbatch advance; then step() and zero_grad(). StepGraph runs warm-up
// iterations eagerly on the stream passed to capture() (they are real iterations: they
// train), checks that nothing in the step would allocate or free
// (DistributedAdam::check_capturable), then captures that same stream:
//   * an "accumulate" microbatch graph (grad sync off) that serves every microbatch but
//     the last (weight-gradient GEMMs must use the accumulate form D = AB + D,
//     since grads are zeroed once per step, not per microbatch);
//   * a "last" microbatch graph with grad sync on, so grad_ready() launches the bucket
//     reduce-scatters during the last backward (only when overlap_grad_reduce is on;
//     otherwise the accumulate graph serves the last microbatch too);
//   * the step graph (step + zero_grad).
// Everything per-step comes from the device (lr slot, schedule, microbatch flags), so a
// replay computes exactly what an eager iteration computes.
#pragma once

#include <functional>
#include <memory>

#include "shardopt/backend.hpp"

namespace shardopt {

class DistributedAdam;
class Fsdp;

/// Options of a StepGraph.
struct StepGraphOptions {
  /// Eager iterations before capture (they train like any other iteration).
  int warmup_iterations = 1;
  /// Capture the whole iteration (every microbatch, step, zero_grad) as one graph,
  /// replayed with one launch. Always on for Fsdp, whose gathers differ per position.
  bool one_graph = false;
};

/// A captured training iteration.
class StepGraph {
 public:
  /// The trainer's forward+backward of one microbatch, enqueued on `stream`: always the
  /// stream the trainer passed to run_eager() or capture() (warm-up and capture alike),
  /// so enqueuing on that stream directly is the same thing. Work the function puts on
  /// any other stream must be ordered with `stream` both ways (event record/wait), as in
  /// any CUDA capture. `last` is a capture-time structural flag: true for the graph of
  /// the step's last microbatch. Anything that varies per microbatch must be read from
  /// the device (DistributedAdam::device_microbatch()).
  using MicrobatchFn = std::function<void(Stream stream, bool last)>;

  StepGraph(DistributedAdam& optimizer, MicrobatchFn microbatch, StepGraphOptions options = {});
  /// FSDP: the whole iteration (all units' gathers, the trainer's compute, the gradient
  /// reduce-scatters, step, zero_grad) is captured as one graph.
  StepGraph(Fsdp& optimizer, MicrobatchFn microbatch, StepGraphOptions options = {});
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  /// Movable; a moved-from StepGraph may only be destroyed or assigned to: its other
  /// calls throw Error(InvalidState). The graph drives the optimizer object it was built
  /// on, or the one that object was moved to.
  StepGraph(StepGraph&&) noexcept;
  StepGraph& operator=(StepGraph&&) noexcept;

  /// Runs one iteration eagerly on `stream`, in exactly the order the graphs replay.
  void run_eager(Stream stream);
  /// Warm-up iterations on `stream`, then capture of `stream` (see the file comment).
  /// Throws Error(CaptureRefused) before capturing when the optimizer's configuration
  /// would allocate or free in the step.
  void capture(Stream stream);
  /// One iteration from the captured graphs. Watched by the step watchdog
  /// (AdamOptions::watchdog.step_timeout, shardopt/watchdog.hpp): an iteration that has
  /// not finished within step_timeout of this call fails the communicator (NCCL is
  /// aborted) and this and every later call that needs it throw Error(Timeout). CUDA: a
  /// background thread of this StepGraph watches one event per replay; at most 8
  /// replays may be unfinished, a further replay() first waits for the oldest. Host
  /// backend: every collective inside the replay is bounded by the step's deadline.
  void replay(Stream stream);
  /// Only the captured step graph (step + zero_grad), e.g. to time the step alone
  /// (Error(InvalidState) in one-graph mode). Watched like replay().
  void replay_step(Stream stream);
  bool captured() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardopt
