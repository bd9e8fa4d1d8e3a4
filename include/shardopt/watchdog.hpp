// shardopt/watchdog.hpp - deadlines that turn a dead or stuck rank into an error.
//
// A rank that crashes, is killed, never reaches a collective or has a GPU stuck in a
// kernel would otherwise leave every other rank blocked forever. With a deadline set,
// the library gives up when one passes: it marks the communicator failed (an NCCL
// communicator is aborted with ncclCommAbort, which also ends NCCL kernels waiting for
// the missing peer) and throws Error(Timeout) naming the operation (and the bucket or
// unit where it knows it) and how long it waited. From then on every collective of that
// communicator, and every call of an optimizer built on it that needs one, throws
// Error(Timeout) again: rebuild the Communicator and the optimizer on every rank (and
// load the last checkpoint). NCCL's asynchronous errors (a peer's failure) are polled
// while the library waits, so they surface as Error(Nccl) instead of a hang.
#pragma once

#include <chrono>

namespace shardopt {

/// The deadlines of a communicator (Communicator::set_watchdog; the optimizers apply
/// AdamOptions::watchdog to theirs). 0 turns a deadline off; at most a year.
struct WatchdogOptions {
  /// Longest time one blocking wait of the library may take: a host-backend collective,
  /// a barrier or agreement all-gather (optimizer construction, checkpoints), and the
  /// optimizers' synchronize() and read_scalars(). Default off: an eager trainer that
  /// waits only through its own stream synchronizations pays nothing.
  std::chrono::milliseconds wait_timeout{0};
  /// Longest time one replayed StepGraph iteration may take, counted from its replay()
  /// call, or from the moment the replay queued before it finished if that is later.
  /// CUDA: a background thread watches each replay's completion (a one-thread kernel at
  /// the end of the captured iteration counts it into pinned host memory; replay() itself
  /// makes no CUDA call for it) and aborts the communicator when it is late; host backend: it bounds every collective inside the replay. Default 5
  /// minutes: far above any real step (seconds), far below the hours a hung job wastes.
  std::chrono::milliseconds step_timeout{std::chrono::minutes(5)};
};

}  // namespace shardopt
