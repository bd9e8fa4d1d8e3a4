#include "comm/comm_impl.hpp"

#include <exception>
#include <mutex>
#include <string>

#include "core/check.hpp"
#include "core/streams.hpp"

namespace shardopt::detail {
namespace {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "Sum";
    case ReduceOp::Average: return "Average";
    case ReduceOp::Max: return "Max";
  }
  return "?";
}

bool known_op(ReduceOp op) { return op == ReduceOp::Sum || op == ReduceOp::Average || op == ReduceOp::Max; }

bool known_dtype(DType t) { return size_of(t) != 0; }

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
  throw Error(ErrorCode::InvalidState,
              std::string("Communicator::") + call +
                  " on a communicator that failed earlier; create a new Communicator (on every rank). "
                  "The first failure was: " +
                  failure());
}

void CommImpl::mark_failed(const std::string& what) noexcept {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        failure_ = what;
      } catch (...) {
      }
      failed_.store(true, std::memory_order_release);
    }
  }
  // Inside an open group the teardown waits until the group is closed (an NCCL group
  // must not end on an aborted communicator).
  if (group_depth_ == 0) on_failure();
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

void CommImpl::all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) {
  require_usable("all_reduce");
  guarded([&] {
    SHARDOPT_REQUIRE(is_float_storage(dtype) || dtype == DType::u32 || dtype == DType::e8m0,
                     ErrorCode::InvalidArgument,
                     std::string("all_reduce: dtype ") + to_string(dtype) +
                         " cannot be reduced; use f32, bf16, f16, u32 or e8m0 (Max only)");
    SHARDOPT_REQUIRE(known_op(op), ErrorCode::InvalidArgument, "all_reduce: unknown ReduceOp");
    SHARDOPT_REQUIRE(!(dtype == DType::u32 && op == ReduceOp::Average), ErrorCode::InvalidArgument,
                     std::string("all_reduce: ReduceOp::") + op_name(op) +
                         " is not defined for u32; use Sum or Max (or a float dtype)");
    SHARDOPT_REQUIRE(!(dtype == DType::e8m0 && op != ReduceOp::Max), ErrorCode::InvalidArgument,
                     std::string("all_reduce: ReduceOp::") + op_name(op) +
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
    return do_split(color, key);
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
