#include "comm/comm_impl.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "core/streams.hpp"

namespace shardopt::detail {
namespace {

bool known_op(ReduceOp op) { return op == ReduceOp::Sum || op == ReduceOp::Average || op == ReduceOp::Max; }

bool known_dtype(DType t) { return size_of(t) != 0; }

long long ms_between(WatchClock::time_point a, WatchClock::time_point b) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count());
}

}  // namespace

CommImpl& require_impl(CommImpl* impl) {
  SHARDOPT_REQUIRE(impl != nullptr, ErrorCode::InvalidState,
                   "this Communicator is empty (default-constructed or moved from); create one with "
                   "communicator_from_mpi, Communicator::from_unique_id or Communicator::self");
  return *impl;
}

CommImpl::CommImpl(Backend backend, int rank, int size, int device)
    : backend_(backend), rank_(rank), size_(size), device_(device) {}

CommImpl::~CommImpl() = default;

std::string CommImpl::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

void CommImpl::require_usable(const char* call) const {
  if (!failed()) return;
  if (failure_code() == ErrorCode::Timeout) {
    throw Error(ErrorCode::Timeout,
                std::string(call) +
                    " refused: this communicator missed a deadline earlier and was torn down (a rank is dead "
                    "or stuck); rebuild the Communicator and the optimizer on every rank, from the last "
                    "checkpoint. The first failure was: " +
                    failure());
  }
  throw Error(ErrorCode::InvalidState,
              std::string("Communicator::") + call +
                  " on a communicator that failed earlier; create a new Communicator (on every rank). "
                  "The first failure was: " +
                  failure());
}

void CommImpl::mark_failed(const std::string& what, ErrorCode code) noexcept {
  bool first = false;
  std::vector<std::weak_ptr<CommImpl>> linked;
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        failure_ = what;
      } catch (...) {
      }
      failure_code_.store(code);
      failed_.store(true);
      first = true;
      try {
        linked = linked_;
      } catch (...) {  // out of memory: the linked groups are not failed with it
      }
    }
  }
  // Inside an open group the teardown waits until the group is closed (an NCCL group
  // must not end on an aborted communicator); grouped() tears down when it closes.
  if (group_depth_.load() == 0) on_failure();
  if (!first) return;
  for (const std::weak_ptr<CommImpl>& w : linked) {
    if (std::shared_ptr<CommImpl> other = w.lock()) {
      try {
        other->mark_failed("a group it was split from, or split into, failed: " + what, code);
      } catch (...) {
      }
    }
  }
}

void CommImpl::set_watchdog(const WatchdogOptions& options) {
  // The upper bound keeps now + limit far from the clock's range (292 years).
  constexpr std::int64_t kMaxMs = std::int64_t{365} * 24 * 3600 * 1000;
  SHARDOPT_REQUIRE(options.wait_timeout.count() >= 0 && options.step_timeout.count() >= 0 &&
                       options.wait_timeout.count() <= kMaxMs && options.step_timeout.count() <= kMaxMs,
                   ErrorCode::InvalidArgument,
                   "WatchdogOptions: wait_timeout (" + std::to_string(options.wait_timeout.count()) +
                       " ms) and step_timeout (" + std::to_string(options.step_timeout.count()) +
                       " ms) must be >= 0 and at most a year (0 turns a deadline off)");
  std::lock_guard<std::mutex> lock(failure_mutex_);
  watchdog_ = options;
}

WatchdogOptions CommImpl::watchdog() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return watchdog_;
}

Deadline CommImpl::wait_deadline() const {
  Deadline d;
  const std::chrono::milliseconds limit = watchdog().wait_timeout;
  if (limit.count() > 0) {
    d.at = d.start + limit;
    d.limit = limit;
    d.limit_name = "wait_timeout";
  }
  if (current_step_deadline().armed() && current_step_deadline().at < d.at) {
    Deadline step = current_step_deadline();
    step.start = d.start;  // the time waited is this wait's own
    return step;
  }
  return d;
}

void CommImpl::fail_timeout(const std::string& what, const Deadline& deadline) {
  const WatchClock::time_point now = WatchClock::now();
  std::string msg = what;
  const std::string& label = OperationLabel::current();
  if (!label.empty() && what.find(label) == std::string::npos) msg += " (" + label + ")";
  msg += " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " did not complete: waited " +
         std::to_string(ms_between(deadline.start, now)) + " ms";
  if (std::string(deadline.limit_name) == "step_timeout") {
    msg += ", and the replayed step" + (current_step_what().empty() ? std::string() : " (" + current_step_what() + ")") +
           " has run " + std::to_string(ms_between(current_step_deadline().start, now)) + " ms, past its step_timeout of " +
           std::to_string(deadline.limit.count()) + " ms";
  } else {
    msg += ", past the wait_timeout of " + std::to_string(deadline.limit.count()) + " ms";
  }
  msg += ". A rank is dead, stuck or skipped this collective; this communicator is now failed";
  if (backend_ == Backend::Cuda) msg += " (its NCCL communicator aborted)";
  msg += ": rebuild the Communicator and the optimizer on every rank, from the last checkpoint";
  mark_failed(msg, ErrorCode::Timeout);
  throw Error(ErrorCode::Timeout, msg);
}

void CommImpl::synchronize(Stream stream, const std::string& what) {
  require_usable(what.c_str());
  check_stream_device(backend_, device_, stream);
  const Deadline d = wait_deadline();
  wait_until([&] { return stream_done(backend_, stream); }, what, d);
}

void CommImpl::inject_fault_for_test(InjectedFault fault, int after) {
  SHARDOPT_REQUIRE(can_inject_faults(), ErrorCode::Unsupported, "fault injection needs a group with peers (MPI or NCCL)");
  SHARDOPT_REQUIRE(after >= 0, ErrorCode::InvalidArgument, "inject_fault_for_test: `after` must be >= 0");
  fault_ = fault;
  fault_after_ = after;
  fault_calls_ = 0;
}

bool CommImpl::inject_fault(const std::string& what) {
  if (fault_ == InjectedFault::None || fault_calls_++ < fault_after_) return false;
  if (fault_ == InjectedFault::ExitProcess) {
    std::fprintf(stderr, "[shardopt test] rank %d exits in the middle of %s (injected fault)\n", rank_, what.c_str());
    std::fflush(nullptr);
    std::_Exit(0);
  }
  return true;  // SkipCollectives: this rank never enters it
}

void CommImpl::check_count(std::int64_t count, const void* data, const char* call) const {
  SHARDOPT_REQUIRE(count >= 0, ErrorCode::InvalidArgument,
                   std::string(call) + ": element count " + std::to_string(count) + " is negative");
  SHARDOPT_REQUIRE(count == 0 || data != nullptr, ErrorCode::InvalidArgument,
                   std::string(call) + ": data is null but the count is " + std::to_string(count));
  if (backend_ == Backend::Host) {
    SHARDOPT_REQUIRE(count <= kMaxMpiCount, ErrorCode::InvalidArgument,
                     std::string(call) + ": " + std::to_string(count) +
                         " elements per rank exceed what one host-backend (MPI) call takes (2^31 - 1); "
                         "use smaller buckets");
  }
}

void CommImpl::reduce_scatter(void* data, std::int64_t count_per_rank, DType dtype, ReduceOp op, Stream stream) {
  require_usable("reduce_scatter");
  guarded([&] {
    SHARDOPT_REQUIRE(is_float_storage(dtype), ErrorCode::InvalidArgument,
                     std::string("reduce_scatter: dtype ") + to_string(dtype) +
                         " cannot be reduced; use f32, bf16 or f16");
    SHARDOPT_REQUIRE(known_op(op), ErrorCode::InvalidArgument, "reduce_scatter: unknown ReduceOp");
    check_count(count_per_rank, data, "reduce_scatter");
    check_stream_device(backend_, device_, stream);
    if (count_per_rank == 0) return;
    do_reduce_scatter(data, count_per_rank, dtype, op, stream);
  });
}

void CommImpl::all_gather(void* data, std::int64_t count_per_rank, DType dtype, Stream stream) {
  require_usable("all_gather");
  guarded([&] {
    SHARDOPT_REQUIRE(known_dtype(dtype), ErrorCode::InvalidArgument, "all_gather: unknown DType");
    check_count(count_per_rank, data, "all_gather");
    check_stream_device(backend_, device_, stream);
    if (count_per_rank == 0) return;
    do_all_gather(data, count_per_rank, dtype, stream);
  });
}

void CommImpl::all_to_all(const void* send, void* recv, std::int64_t count_per_rank, DType dtype, Stream stream,
                          bool own, std::int64_t send_stride, std::int64_t recv_stride) {
  require_usable("all_to_all");
  guarded([&] {
    SHARDOPT_REQUIRE(known_dtype(dtype), ErrorCode::InvalidArgument, "all_to_all: unknown DType");
    check_count(count_per_rank, send, "all_to_all");
    check_count(count_per_rank, recv, "all_to_all");
    check_stream_device(backend_, device_, stream);
    const std::int64_t ss = send_stride == 0 ? count_per_rank : send_stride;
    const std::int64_t rs = recv_stride == 0 ? count_per_rank : recv_stride;
    SHARDOPT_REQUIRE(ss >= count_per_rank && rs >= count_per_rank, ErrorCode::InvalidArgument,
                     "all_to_all: piece strides " + std::to_string(ss) + " (send) and " + std::to_string(rs) +
                         " (receive) must be at least the piece's " + std::to_string(count_per_rank) +
                         " elements (0: the pieces back to back); pieces must not overlap");
    if (count_per_rank == 0) return;
    // The bytes from the first piece's start to the last piece's end.
    auto extent = [&](std::int64_t stride) {
      return (static_cast<std::size_t>(stride) * static_cast<std::size_t>(size_ - 1) +
              static_cast<std::size_t>(count_per_rank)) *
             size_of(dtype);
    };
    const auto s = reinterpret_cast<std::uintptr_t>(send);
    const auto r = reinterpret_cast<std::uintptr_t>(recv);
    SHARDOPT_REQUIRE(s + extent(ss) <= r || r + extent(rs) <= s, ErrorCode::InvalidArgument,
                     "all_to_all: send and recv overlap; an all-to-all is not in place, give it two buffers");
    do_all_to_all(send, recv, count_per_rank, dtype, stream, own, ss, rs);
  });
}

void CommImpl::all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) {
  require_usable("all_reduce");
  guarded([&] {
    SHARDOPT_REQUIRE(is_float_storage(dtype) || dtype == DType::u32 || dtype == DType::e8m0,
                     ErrorCode::InvalidArgument,
                     std::string("all_reduce: dtype ") + to_string(dtype) +
                         " cannot be reduced; use f32, bf16, f16, u32 or e8m0 (Max only)");
    SHARDOPT_REQUIRE(known_op(op), ErrorCode::InvalidArgument, "all_reduce: unknown ReduceOp");
    SHARDOPT_REQUIRE(!(dtype == DType::u32 && op == ReduceOp::Average), ErrorCode::InvalidArgument,
                     std::string("all_reduce: ReduceOp::") + to_string(op) +
                         " is not defined for u32; use Sum or Max (or a float dtype)");
    SHARDOPT_REQUIRE(!(dtype == DType::e8m0 && op != ReduceOp::Max), ErrorCode::InvalidArgument,
                     std::string("all_reduce: ReduceOp::") + to_string(op) +
                         " is not defined for e8m0 scale bytes; use Max (the byte-wise maximum of MXFP8 "
                         "scales, 8-bit unsigned)");
    check_count(count, data, "all_reduce");
    check_stream_device(backend_, device_, stream);
    if (count == 0) return;
    do_all_reduce(data, count, dtype, op, stream);
  });
}

void CommImpl::barrier() {
  require_usable("barrier");
  guarded([&] { do_barrier(); });
}

std::shared_ptr<CommImpl> CommImpl::split(int color, int key) {
  require_usable("split");
  return guarded([&] {
    SHARDOPT_REQUIRE(color >= 0, ErrorCode::InvalidArgument,
                     "split: color " + std::to_string(color) + " is negative; colors must be >= 0");
    std::shared_ptr<CommImpl> child = do_split(color, key);
    child->set_watchdog(watchdog());
    // A group and the groups split from it fail together (a dead rank breaks them all).
    {
      std::lock_guard<std::mutex> lock(failure_mutex_);
      linked_.push_back(child);
    }
    {
      std::lock_guard<std::mutex> lock(child->failure_mutex_);
      child->linked_.push_back(weak_from_this());
    }
    return child;
  });
}

void CommImpl::grouped(const std::function<void()>& calls) {
  require_usable("grouped collectives");
  guarded([&] {
    do_group_start();
    ++group_depth_;
    std::exception_ptr error;
    try {
      calls();
    } catch (...) {
      error = std::current_exception();
    }
    try {
      do_group_end();  // closes the group even after a failed call
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    --group_depth_;
    if (error) std::rethrow_exception(error);  // the guard now tears the group down
    // Marked failed from another thread (the step watchdog) while the group was open.
    if (failed() && group_depth_.load() == 0) on_failure();
  });
}

std::vector<std::uint64_t> CommImpl::all_gather_u64(const std::vector<std::uint64_t>& mine) {
  require_usable("all_gather_value");
  return guarded([&] {
    if (size_ == 1) return mine;
    return do_all_gather_u64(mine);
  });
}

void CommImpl::provoke_backend_error_for_test() {
  require_usable("provoke_backend_error_for_test");
  guarded([&] {
    do_invalid_call_for_test();
    SHARDOPT_REQUIRE(false, ErrorCode::Internal,
                     "the backend accepted a call with an invalid datatype (parameter checks disabled?)");
  });
}

}  // namespace shardopt::detail
