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
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

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
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// The first failure's message ("" while not failed).
  std::string failure() const;
  /// Throws Error(InvalidState) quoting the first failure when the group has failed.
  void require_usable(const char* call) const;

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

  /// Marks the group failed with `what` (only the first failure is kept) and lets the
  /// backend tear down (ncclCommAbort), once no grouped() call is open.
  void mark_failed(const std::string& what) noexcept;

  /// Runs `f`; an exception marks the group failed and propagates.
  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
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
  virtual void do_barrier() = 0;
  virtual std::shared_ptr<CommImpl> do_split(int color, int key) = 0;
  virtual std::vector<std::uint64_t> do_all_gather_u64(const std::vector<std::uint64_t>& mine) = 0;
  virtual void do_invalid_call_for_test() = 0;
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
  int group_depth_ = 0;  // open grouped() calls
  mutable std::mutex failure_mutex_;
  std::string failure_;
};

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

/// A one-rank group (Communicator::self): collectives are identities.
std::shared_ptr<CommImpl> make_self_comm(Backend backend);

/// Largest element count one host-backend (MPI) call takes: MPI counts are int.
inline constexpr std::int64_t kMaxMpiCount = 2147483647;

}  // namespace shardopt::detail
