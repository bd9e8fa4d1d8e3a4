// replay_watch.hpp - the step watchdog of a StepGraph (shardopt/watchdog.hpp): each
// replayed iteration must complete within the communicator's step_timeout of its
// replay() call, or from the moment the replay queued before it was seen finished, if
// that is later (a replay waiting behind others is not yet running).
//
// CUDA: the graph that ends an iteration ends with a one-thread kernel that adds 1 to a
// counter in pinned host memory (mark_completion, captured once), so the counter is the
// number of replays that have completed. replay() only notes its number and the time:
// no CUDA call on the caller's thread, one short lock. A background thread sleeps until
// the oldest replay's deadline (waking at least every step_timeout / 20, and every second
// to poll NCCL's asynchronous errors) and reads the counter then; a replay not done by its
// deadline marks the communicator failed with Error(Timeout), which aborts NCCL (its
// kernels waiting for a dead peer end) and fails the groups split from it. Replays of one
// StepGraph complete in order (they share its buffers, so the trainer orders them), which
// is what lets one counter say which ones are done. At most kMaxInFlight replays may be
// unfinished: a later replay() first waits for the oldest (as the bounded CUDA launch
// queue would), so a trainer that only calls replay() still gets Error(Timeout) instead
// of blocking in the driver forever.
//
// Host backend: a replay runs on the caller's thread; StepGraph bounds it with a
// StepDeadlineScope instead, and nothing here runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/memory.hpp"
#include "core/streams.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt::detail {

class ReplayWatch {
 public:
  /// Replays still unfinished when a new one may start.
  static constexpr std::size_t kMaxInFlight = 8;

  /// Watches replays that fail `comm` (a copy is kept) when late; `what` names the
  /// optimizer in messages ("DistributedAdam"). CUDA: allocates the completion counter.
  ReplayWatch(Communicator comm, std::string what);
  /// Stops and joins the thread; unfinished replays are no longer watched.
  ~ReplayWatch();
  ReplayWatch(const ReplayWatch&) = delete;
  ReplayWatch& operator=(const ReplayWatch&) = delete;

  /// Before launching a replay: Error(Timeout) (or the group's other failure) if the
  /// communicator has failed; forgets finished replays; with kMaxInFlight unfinished,
  /// waits for the oldest (Error(Timeout) once it is past its deadline).
  void before_replay();
  /// After launching a replay (CUDA, step_timeout > 0): watches it (starts the thread on
  /// first use). Its completion is the counter reaching its number.
  void after_replay();
  /// CUDA, inside the capture of the graph that ends an iteration, as its last work on
  /// `stream`: the kernel that counts the replay complete. Host backend: nothing.
  void mark_completion(Stream stream);
  /// Number of the next replay (1-based, counted over this watch's life).
  std::uint64_t next_number() const noexcept { return number_ + 1; }

  /// Test hook (any backend): watches one more "replay" whose completion is `done()`
  /// instead of the counter, with deadline `limit` from now; from then on
  /// before_replay() applies its in-flight bound on this backend too. Lets the host
  /// suites drive the thread, the deadlines and the bound without a GPU.
  void watch_for_test(std::function<bool()> done, std::chrono::milliseconds limit);

 private:
  struct Entry {
    std::function<bool()> probe;  // watch_for_test: the completion; else the counter's
    std::chrono::steady_clock::time_point start, deadline;
    std::chrono::milliseconds limit{0};
    std::uint64_t number = 0;
  };
  bool finished(const Entry& e) const { return e.probe ? e.probe() : completed() >= e.number; }
  // Replays completed so far (the counter the captured kernel advances).
  std::uint64_t completed() const noexcept;
  void run();
  // Watches replay number_ (the lock held): its completion is `probe()`, or the counter
  // when probe is null; its deadline `limit` from now. Starts the thread on first use.
  void watch_locked(std::function<bool()> probe, std::chrono::milliseconds limit);
  // Pops finished entries from the front (the lock held).
  void reap_locked();
  std::string late_message(const Entry& e, std::chrono::steady_clock::time_point now) const;

  Communicator comm_;
  std::string what_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Entry> pending_;  // oldest first (deadlines increase)
  DeviceBuffer counter_;       // CUDA: one unsigned long long in pinned host memory
  std::uint64_t number_ = 0;
  bool probes_ = false;  // watch_for_test was used: bound replays on any backend
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shardopt::detail
