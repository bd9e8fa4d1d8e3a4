// deadline.hpp - when a blocking wait gives up, and what it was waiting for: the
// thread-local pieces of the watchdog (shardopt/watchdog.hpp). A layer above comm names
// the collectives it enqueues with an OperationLabel ("bucket 3 gradient reduce-scatter")
// and bounds a replayed step with a StepDeadlineScope; the backends read both when they
// enqueue and when they wait.
#pragma once

#include <chrono>
#include <string>

namespace shardopt::detail {

using WatchClock = std::chrono::steady_clock;

/// When a blocking wait gives up: `at` (time_point::max(): never), set by the limit named
/// `limit_name` ("wait_timeout" or "step_timeout") of `limit` milliseconds.
struct Deadline {
  WatchClock::time_point start = WatchClock::now();
  WatchClock::time_point at = WatchClock::time_point::max();
  std::chrono::milliseconds limit{0};
  const char* limit_name = "";
  bool armed() const noexcept { return at != WatchClock::time_point::max(); }
};

/// While it lives, the collectives this thread enqueues are named `what` in timeout
/// messages (nested labels restore the outer one).
class OperationLabel {
 public:
  explicit OperationLabel(std::string what);
  ~OperationLabel();
  OperationLabel(const OperationLabel&) = delete;
  OperationLabel& operator=(const OperationLabel&) = delete;
  /// The innermost live label of this thread ("" when none).
  static const std::string& current();
  /// `call` followed by the current label: "all_reduce (bucket 3 ...)".
  static std::string named(const char* call);

 private:
  std::string previous_;
};

/// While it lives, every blocking wait of this thread gives up at most `limit` after the
/// scope began (a replayed step's step_timeout; 0: no bound); `what` names the step.
/// A nested scope never extends the outer deadline.
class StepDeadlineScope {
 public:
  StepDeadlineScope(std::chrono::milliseconds limit, std::string what);
  ~StepDeadlineScope();
  StepDeadlineScope(const StepDeadlineScope&) = delete;
  StepDeadlineScope& operator=(const StepDeadlineScope&) = delete;

 private:
  Deadline previous_;
  std::string previous_what_;
};

/// The calling thread's step deadline (not armed outside a StepDeadlineScope) and the
/// name of its step.
const Deadline& current_step_deadline();
const std::string& current_step_what();

}  // namespace shardopt::detail
