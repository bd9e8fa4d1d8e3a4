#include "optimizer/replay_watch.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "comm/comm_impl.hpp"
#include "core/device_guard.hpp"
#include "kernels/adam/step_control.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {
namespace {

using Clock = std::chrono::steady_clock;

long long ms(Clock::duration d) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

// How often the thread looks while replays are pending: often enough to notice a missed
// deadline within 5% of it, at most once a second (NCCL's asynchronous errors).
Clock::duration poll_period(std::chrono::milliseconds limit) {
  const auto twentieth = std::chrono::duration_cast<Clock::duration>(limit) / 20;
  return std::clamp<Clock::duration>(twentieth, std::chrono::milliseconds(1), std::chrono::seconds(1));
}

}  // namespace

ReplayWatch::ReplayWatch(Communicator comm, std::string what) : comm_(std::move(comm)), what_(std::move(what)) {
  if (comm_.backend() == Backend::Cuda) {
    DeviceGuard guard(comm_.device());
    counter_ = DeviceBuffer(Backend::Cuda, sizeof(unsigned long long), MemoryKind::Pinned);
    *counter_.as<unsigned long long>() = 0;
  }
}

std::uint64_t ReplayWatch::completed() const noexcept {
  if (counter_.data() == nullptr) return 0;
  // The kernel writes it through the system fence; a plain atomic read sees the value.
  return __atomic_load_n(counter_.as<unsigned long long>(), __ATOMIC_ACQUIRE);
}

void ReplayWatch::mark_completion(Stream stream) {
  if (comm_.backend() != Backend::Cuda) return;
  kernels::count_completion_cuda(counter_.as<unsigned long long>(), stream);
}

ReplayWatch::~ReplayWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ReplayWatch::reap_locked() {
  bool reaped = false;
  while (!pending_.empty() && finished(pending_.front())) {
    pending_.pop_front();
    reaped = true;
  }
  // A replay queued behind others starts when they finish: its deadline counts from the
  // moment the one before it is seen finished, if that is later than its replay() call.
  if (reaped && !pending_.empty()) {
    Entry& next = pending_.front();
    const Clock::time_point now = Clock::now();
    if (now > next.start) {
      next.start = now;
      next.deadline = now + next.limit;
    }
  }
}

std::string ReplayWatch::late_message(const Entry& e, Clock::time_point now) const {
  return "StepGraph::replay: iteration #" + std::to_string(e.number) + " of " + what_ + " (rank " +
         std::to_string(comm_.rank()) + " of " + std::to_string(comm_.size()) + "), replayed " +
         std::to_string(ms(now - e.start)) + " ms ago, has not completed within its step_timeout of " +
         std::to_string(e.limit.count()) +
         " ms: a rank is dead or stuck, or a kernel queued on the stream never finishes. The communicator was "
         "aborted (NCCL kernels waiting for a peer end) and every call that needs it now throws Error(Timeout): "
         "rebuild the Communicator and the optimizer on every rank, from the last checkpoint";
}

void ReplayWatch::before_replay() {
  comm_.require_usable("StepGraph::replay");
  CommImpl& impl = CommAccess::require(comm_);
  std::unique_lock<std::mutex> lock(mutex_);
  if (comm_.backend() != Backend::Cuda && !probes_) return;
  reap_locked();
  while (pending_.size() >= kMaxInFlight) {
    const Entry oldest = pending_.front();
    lock.unlock();
    Deadline deadline;
    deadline.start = oldest.start;
    deadline.at = oldest.deadline;
    deadline.limit = oldest.limit;
    deadline.limit_name = "step_timeout";
    impl.wait_until(
        [&] {
          std::lock_guard<std::mutex> relock(mutex_);
          return pending_.empty() || pending_.front().number != oldest.number || finished(oldest);
        },
        "StepGraph::replay", deadline,
        [&] {
          const std::string msg = late_message(oldest, Clock::now());
          impl.mark_failed(msg, ErrorCode::Timeout);
          throw Error(ErrorCode::Timeout, msg);
        });
    lock.lock();
    reap_locked();
  }
}

void ReplayWatch::watch_locked(std::function<bool()> probe, std::chrono::milliseconds limit) {
  const Clock::time_point now = Clock::now();
  Entry e;
  e.probe = std::move(probe);
  e.start = now;
  e.deadline = now + limit;
  e.limit = limit;
  e.number = number_;
  pending_.push_back(std::move(e));
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

void ReplayWatch::after_replay() {
  ++number_;
  if (comm_.backend() != Backend::Cuda) return;
  const std::chrono::milliseconds limit = comm_.watchdog().step_timeout;
  if (limit.count() == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  watch_locked(nullptr, limit);
}

void ReplayWatch::watch_for_test(std::function<bool()> done, std::chrono::milliseconds limit) {
  std::lock_guard<std::mutex> lock(mutex_);
  probes_ = true;
  ++number_;
  watch_locked(std::move(done), limit);
}

void ReplayWatch::run() {
  CommImpl& impl = CommAccess::require(comm_);
  // NCCL (its asynchronous-error poll) lives on the communicator's device: make it this
  // thread's current device, so that the thread creates no context on another GPU.
  std::optional<DeviceGuard> device;
  if (comm_.backend() == Backend::Cuda) {
    try {
      device.emplace(comm_.device());
    } catch (const std::exception& e) {
      impl.mark_failed(std::string("the step watchdog could not select its device: ") + e.what());
      return;
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  Clock::duration poll = std::chrono::seconds(1);
  while (!stop_) {
    try {
      reap_locked();
    } catch (const std::exception& e) {  // a test's probe threw: nothing can be watched any more
      lock.unlock();
      impl.mark_failed(e.what());
      return;
    }
    if (!pending_.empty()) {
      const Entry& front = pending_.front();
      poll = poll_period(front.limit);
      const Clock::time_point now = Clock::now();
      if (now >= front.deadline) {
        const std::string msg = late_message(front, now);
        lock.unlock();
        impl.mark_failed(msg, ErrorCode::Timeout);  // aborts NCCL, fails the split groups
        return;
      }
      lock.unlock();
      try {
        impl.poll_async_error();  // a peer's failure: marks the group failed itself
      } catch (...) {
        return;
      }
      lock.lock();
      if (stop_) break;
    }
    if (impl.failed()) return;
    Clock::time_point next = Clock::now() + poll;
    if (!pending_.empty()) next = std::min(next, pending_.front().deadline);
    wake_.wait_until(lock, next, [this] { return stop_; });
  }
}

}  // namespace shardopt::detail
