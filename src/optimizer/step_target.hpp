// step_target.hpp - what StepGraph needs from an optimizer: the one small interface that
// DistributedAdam and Fsdp both implement (their Impl classes), so that StepGraph drives
// either the same way: microbatches with grad sync off and on, the device microbatch
// advance, step + zero_grad, and the checks and joins around a capture.
#pragma once

#include "shardopt/backend.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt::detail {

class StepTarget {
 public:
  virtual ~StepTarget() = default;
  virtual Backend step_backend() const = 0;
  /// The communicator whose step_timeout bounds a replay and which a late replay fails
  /// (the groups split from it fail with it).
  virtual const Communicator& step_comm() const = 0;
  /// Microbatches per iteration (the options' value).
  virtual int iteration_microbatches() const = 0;
  /// True when the last microbatch needs a graph of its own (its backward reduces).
  virtual bool separate_last_microbatch() const = 0;
  /// True when the optimizer can only be captured as one whole-iteration graph.
  virtual bool whole_iteration_only() const = 0;
  /// Turns the grad_ready() reductions of a microbatch on or off.
  virtual void set_iteration_grad_sync(bool enabled) = 0;
  virtual void advance_iteration_microbatch(Stream stream) = 0;
  /// The end of an iteration: step() then zero_grad().
  virtual void step_and_zero_grad(Stream stream) = 0;
  /// Error(CaptureRefused) when capturing now would allocate or free inside the graph.
  virtual void check_step_capturable() const = 0;
  /// Joins work an eager iteration may leave in flight (a capture cannot wait for it).
  virtual void finish_pending(Stream stream) = 0;
  /// The end of the last microbatch: `stream` waits for the reductions its backward began.
  virtual void join_reductions(Stream stream) = 0;

 protected:
  StepTarget() = default;
  StepTarget(const StepTarget&) = default;
  StepTarget& operator=(const StepTarget&) = default;
};

}  // namespace shardopt::detail
