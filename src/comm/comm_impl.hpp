// comm_impl.hpp - the backend-independent part of a communicator: argument checks, the
// failed-group state, and the interface each backend (one-rank "self", NCCL, MPI)
// implements.
//
// Every public collective goes through CommImpl: it refuses calls on a failed group,
// validates the arguments, and runs the backend's operation inside guarded(): if that
// throws, the group is marked failed (an NCCL communicator is aborted) before the
// error propagates, and every later call throws Error(InvalidState) quoting the first
// failure. A rank whose call failed is out of step with its peers; continuing could only
// hang or mix up data.
//
// Deadlines (shardopt/watchdog.hpp): every blocking wait of a backend asks
// wait_deadline() when to give up, which is the earlier of the group's wait_timeout and
// the deadline of the replayed step the calling thread is running (StepDeadlineScope),
// and polls with wait_until(); a missed deadline marks the group failed with
// ErrorCode::Timeout and throws. The collectives enqueued while an OperationLabel lives
// carry its text into those messages ("bucket 3 gradient reduce-scatter").
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/error.hpp"
#include "shardopt/watchdog.hpp"
#include "comm/deadline.hpp"

namespace shardopt::detail {

/// Faults a test can inject into a host-backend (MPI) group (internal, never public):
/// from its `after`-th collective on (counting from 0, blocking helpers included), the
/// rank skips every collective (it never enters them) or exits the process at once.
enum class InjectedFault { None, SkipCollectives, ExitProcess };

/// A group of ranks: the state shared by every copy of a Communicator.
class CommImpl : public std::enable_shared_from_this<CommImpl> {
 public:
  CommImpl(Backend backend, int rank, int size, int device);
  virtual ~CommImpl();
  CommImpl(const CommImpl&) = delete;
  CommImpl& operator=(const CommImpl&) = delete;

  Backend backend() const noexcept { return backend_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }

  // The public operations: checked, then run by the backend under guarded().
  void reduce_scatter(void* data, std::int64_t count_per_rank, DType dtype, ReduceOp op, Stream stream);
  void all_gather(void* data, std::int64_t count_per_rank, DType dtype, Stream stream);
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream);
  /// `own` false: piece rank() of `recv` is left untouched (Communicator::all_to_all_peers).
  /// Piece r of `send` starts at element r * send_stride, piece r of `recv` at r *
  /// recv_stride (0: count_per_rank, the pieces back to back; else at least count_per_rank).
  void all_to_all(const void* send, void* recv, std::int64_t count_per_rank, DType dtype, Stream stream,
                  bool own = true, std::int64_t send_stride = 0, std::int64_t recv_stride = 0);
  void barrier();
  std::shared_ptr<CommImpl> split(int color, int key);
  /// Runs `calls` (collectives of this group, possibly on several buffers) as one
  /// backend group: NCCL aggregates them into one launch (ncclGroupStart/End); the other
  /// backends run them in order. A failure inside still closes the group.
  void grouped(const std::function<void()>& calls);
  /// Blocking all-gather of `mine` (the same length on every rank); returns size() *
  /// mine.size() values, rank r's at [r * mine.size(), (r + 1) * mine.size()).
  std::vector<std::uint64_t> all_gather_u64(const std::vector<std::uint64_t>& mine);

  /// True once a call has failed.
  bool failed() const noexcept { return failed_.load(); }
  /// The first failure's message ("" while not failed).
  std::string failure() const;
  /// Timeout when the first failure was a missed deadline, else InvalidState.
  ErrorCode failure_code() const noexcept { return failure_code_.load(); }
  /// Throws quoting the first failure when the group has failed: Error(Timeout) after a
  /// missed deadline, else Error(InvalidState).
  void require_usable(const char* call) const;

  /// The group's deadlines (Communicator::set_watchdog).
  void set_watchdog(const WatchdogOptions& options);
  WatchdogOptions watchdog() const;
  /// The deadline of a blocking wait starting now: now + wait_timeout, or the calling
  /// thread's step deadline (StepDeadlineScope) when that is earlier.
  Deadline wait_deadline() const;
  /// Marks the group failed with ErrorCode::Timeout (the backend tears down: NCCL is
  /// aborted) and throws Error(Timeout) naming `what`, the limit and the time waited.
  [[noreturn]] void fail_timeout(const std::string& what, const Deadline& deadline);
  /// Polls `done()` until it is true; between polls checks the group (a failure marked
  /// by another thread throws here) and the backend's asynchronous errors; gives up at
  /// `deadline` through fail_timeout. Yields for the first millisecond, then sleeps
  /// 50 us between polls.
  template <class Done>
  void wait_until(Done&& done, const std::string& what, const Deadline& deadline) {
    wait_until(done, what, deadline, [&] { fail_timeout(what, deadline); });
  }
  /// The same loop; at the deadline it calls `late()`, which must mark the group failed
  /// and throw (a caller with a message of its own: the step watchdog).
  template <class Done, class Late>
  void wait_until(Done&& done, const std::string& what, const Deadline& deadline, Late&& late);
  /// Blocks until the work queued on `stream` so far has finished, within wait_timeout
  /// (Communicator::synchronize). Host backend: its streams have nothing in flight.
  void synchronize(Stream stream, const std::string& what);
  /// Errors the backend found asynchronously (NCCL: ncclCommGetAsyncError, a peer's
  /// failure or a network error): marks the group failed and throws. Thread-safe.
  virtual void poll_async_error() {}
  /// True once the backend's own communicator was torn down after a failure (NCCL:
  /// ncclCommAbort returned); the other backends have nothing to tear down.
  virtual bool backend_released() const noexcept { return failed(); }
  /// Test hook: arms an InjectedFault (MPI and NCCL groups; Error(Unsupported) on a
  /// one-rank group, which has no peers to fail).
  void inject_fault_for_test(InjectedFault fault, int after);

  /// Registers a buffer with the backend; nullptr where it has no registration (see
  /// Communicator::register_buffer). Not a collective; does not mark the group failed.
  virtual void* register_buffer(void* data, std::size_t bytes) {
    (void)data;
    (void)bytes;
    return nullptr;
  }
  /// Undoes register_buffer (never throws; nothing once the backend was torn down).
  virtual void deregister_buffer(void* handle) noexcept { (void)handle; }

  /// Test hook: hands the backend a call with an invalid datatype (ncclNumTypes /
  /// MPI_DATATYPE_NULL), so the backend itself reports the error and the group goes
  /// through the real failure path (mark failed, abort NCCL). Collective: call it on
  /// every rank. Always throws the backend's error.
  void provoke_backend_error_for_test();

  /// Marks the group failed with `what` (only the first failure and its code are kept)
  /// and lets the backend tear down (ncclCommAbort), once no grouped() call is open; the
  /// groups linked by split() (its parent, its children) are marked failed with it.
  /// Thread-safe: the step watchdog calls it from its own thread.
  void mark_failed(const std::string& what, ErrorCode code = ErrorCode::InvalidState) noexcept;

  /// Runs `f`; an exception marks the group failed and propagates.
  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error& e) {
      mark_failed(e.what(), e.code() == ErrorCode::Timeout ? ErrorCode::Timeout : ErrorCode::InvalidState);
      throw;
    } catch (const std::exception& e) {
      mark_failed(e.what());
      throw;
    }
  }

  /// A Communicator handle for an impl (Communicator's constructor is private).
  static Communicator wrap(std::shared_ptr<CommImpl> impl) { return Communicator(std::move(impl)); }

 protected:
  // Backend operations; arguments are already validated, count > 0, group usable.
  virtual void do_reduce_scatter(void* data, std::int64_t count_per_rank, DType dtype, ReduceOp op,
                                 Stream stream) = 0;
  virtual void do_all_gather(void* data, std::int64_t count_per_rank, DType dtype, Stream stream) = 0;
  virtual void do_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) = 0;
  /// Pieces of count_per_rank elements of dtype, piece r at element r * send_stride of
  /// `send` and r * recv_stride of `recv` (strides >= count_per_rank, resolved: never 0);
  /// send and recv do not overlap. `own` false: this rank's piece is neither sent nor
  /// received (recv's piece rank() untouched).
  virtual void do_all_to_all(const void* send, void* recv, std::int64_t count_per_rank, DType dtype, Stream stream,
                             bool own, std::int64_t send_stride, std::int64_t recv_stride) = 0;
  virtual void do_barrier() = 0;
  virtual std::shared_ptr<CommImpl> do_split(int color, int key) = 0;
  virtual std::vector<std::uint64_t> do_all_gather_u64(const std::vector<std::uint64_t>& mine) = 0;
  virtual void do_invalid_call_for_test() = 0;
  /// Applies an armed InjectedFault to the collective `what` about to start: exits the
  /// process, or returns true when this rank skips it. Backends call it where the
  /// collective starts (the MPI backend when its host-stream operation runs).
  bool inject_fault(const std::string& what);
  bool fault_armed() const noexcept { return fault_ != InjectedFault::None; }
  /// False for a backend without peers (the one-rank group).
  virtual bool can_inject_faults() const noexcept { return true; }
  virtual void do_group_start() {}
  virtual void do_group_end() {}
  /// Called when the group fails (NCCL: ncclCommAbort), possibly more than once: it must
  /// be idempotent and must not throw.
  virtual void on_failure() noexcept {}

 private:
  void check_count(std::int64_t count, const void* data, const char* call) const;

  Backend backend_;
  int rank_;
  int size_;
  int device_;
  std::atomic<bool> failed_{false};
  std::atomic<ErrorCode> failure_code_{ErrorCode::InvalidState};
  std::atomic<int> group_depth_{0};  // open grouped() calls
  mutable std::mutex failure_mutex_;
  std::string failure_;
  WatchdogOptions watchdog_;  // under failure_mutex_
  InjectedFault fault_ = InjectedFault::None;  // test hook (one thread: the rank's own)
  int fault_after_ = 0;
  int fault_calls_ = 0;
  std::vector<std::weak_ptr<CommImpl>> linked_;  // split parent and children, under failure_mutex_
};

template <class Done, class Late>
void CommImpl::wait_until(Done&& done, const std::string& what, const Deadline& deadline, Late&& late) {
  const WatchClock::time_point spin_until = WatchClock::now() + std::chrono::milliseconds(1);
  for (;;) {
    require_usable(what.c_str());  // first: a failure marked by another thread wins
    if (done()) return;
    poll_async_error();
    const WatchClock::time_point now = WatchClock::now();
    if (now >= deadline.at) late();
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

/// The impl behind a handle; throws Error(InvalidState) for an empty Communicator.
CommImpl& require_impl(CommImpl* impl);

/// The library's own access to the impl behind a public Communicator.
struct CommAccess {
  static CommImpl* impl(const Communicator& comm) noexcept { return comm.impl_.get(); }
  /// The impl; Error(InvalidState) for an empty handle.
  static CommImpl& require(const Communicator& comm) { return require_impl(comm.impl_.get()); }
};

/// Test hook (CommImpl::provoke_backend_error_for_test) on the group behind `comm`:
/// collective, always throws the backend's error and marks the group failed.
void provoke_backend_error_for_test(const Communicator& comm);

/// Test hook (CommImpl::inject_fault_for_test) on the group behind `comm`.
void inject_fault_for_test(const Communicator& comm, InjectedFault fault, int after);

/// A one-rank group (Communicator::self): collectives are identities.
std::shared_ptr<CommImpl> make_self_comm(Backend backend);

/// Largest element count one host-backend (MPI) call takes: MPI counts are int.
inline constexpr std::int64_t kMaxMpiCount = 2147483647;

}  // namespace shardopt::detail
