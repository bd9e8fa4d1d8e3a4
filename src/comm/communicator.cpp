// Communicator: the public handle; every call forwards to the shared CommImpl.
#include "shardopt/communicator.hpp"

#include <utility>
#include <vector>

#include "comm/comm_impl.hpp"
#include "comm/nccl_comm.hpp"
#include "comm/registration_rule.hpp"
#include "shardopt/error.hpp"

namespace shardopt {

const char* to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum: return "Sum";
    case ReduceOp::Average: return "Average";
    case ReduceOp::Max: return "Max";
  }
  return "?";
}

const char* to_string(GradReducePrecision precision) noexcept {
  switch (precision) {
    case GradReducePrecision::Native: return "Native";
    case GradReducePrecision::F32Accumulate: return "F32Accumulate";
  }
  return "?";
}

namespace {
detail::CommImpl& usable(const std::shared_ptr<detail::CommImpl>& impl) { return detail::require_impl(impl.get()); }
}  // namespace

Communicator Communicator::self(Backend backend) { return Communicator(detail::make_self_comm(backend)); }

Communicator Communicator::from_unique_id(const UniqueId& id, int rank, int size, int device) {
  return Communicator(detail::make_nccl_comm(id, rank, size, device));
}

int Communicator::rank() const { return usable(impl_).rank(); }
int Communicator::size() const { return usable(impl_).size(); }
Backend Communicator::backend() const { return usable(impl_).backend(); }
int Communicator::device() const { return usable(impl_).device(); }

void Communicator::reduce_scatter(void* data, std::int64_t count_per_rank, DType dtype, ReduceOp op,
                                  Stream stream) const {
  usable(impl_).reduce_scatter(data, count_per_rank, dtype, op, stream);
}

void Communicator::all_gather(void* data, std::int64_t count_per_rank, DType dtype, Stream stream) const {
  usable(impl_).all_gather(data, count_per_rank, dtype, stream);
}

void Communicator::all_to_all(const void* send, void* recv, std::int64_t count_per_rank, DType dtype,
                              Stream stream) const {
  usable(impl_).all_to_all(send, recv, count_per_rank, dtype, stream);
}

void Communicator::all_to_all_peers(const void* send, void* recv, std::int64_t count_per_rank, DType dtype,
                                    Stream stream) const {
  usable(impl_).all_to_all(send, recv, count_per_rank, dtype, stream, /*own=*/false);
}

void Communicator::all_to_all_peers(const void* send, std::int64_t send_stride, void* recv, std::int64_t recv_stride,
                                    std::int64_t count_per_rank, DType dtype, Stream stream) const {
  usable(impl_).all_to_all(send, recv, count_per_rank, dtype, stream, /*own=*/false, send_stride, recv_stride);
}

void Communicator::all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) const {
  usable(impl_).all_reduce(data, count, dtype, op, stream);
}

void Communicator::barrier() const { usable(impl_).barrier(); }

Communicator Communicator::split(int color, int key) const { return Communicator(usable(impl_).split(color, key)); }

std::vector<std::uint64_t> Communicator::all_gather_value(std::uint64_t value) const {
  return usable(impl_).all_gather_u64({value});
}

std::vector<std::uint64_t> Communicator::all_gather_values(const std::vector<std::uint64_t>& values) const {
  return usable(impl_).all_gather_u64(values);
}

void Communicator::grouped(const std::function<void()>& calls) const { usable(impl_).grouped(calls); }

BufferRegistration Communicator::register_buffer(void* data, std::size_t bytes) const {
  BufferRegistration r;
  r.handle_ = usable(impl_).register_buffer(data, bytes);
  if (r.handle_ != nullptr) r.comm_ = impl_;
  return r;
}

std::vector<BufferRegistration> Communicator::register_buffers(const std::vector<BufferToRegister>& buffers) const {
  std::vector<BufferUse> uses;
  for (const BufferToRegister& b : buffers) uses.push_back(b.use);
  const std::vector<bool> plan = detail::registration_plan(uses);
  std::vector<BufferRegistration> out;
  out.reserve(buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const bool wanted = plan[i] && buffers[i].bytes > 0;
    out.push_back(wanted ? register_buffer(buffers[i].data, buffers[i].bytes) : BufferRegistration{});
  }
  return out;
}

void Communicator::set_watchdog(const WatchdogOptions& options) const { usable(impl_).set_watchdog(options); }

WatchdogOptions Communicator::watchdog() const { return usable(impl_).watchdog(); }

void Communicator::synchronize(Stream stream) const { usable(impl_).synchronize(stream, "synchronize"); }

bool Communicator::failed() const noexcept { return impl_ != nullptr && impl_->failed(); }

void Communicator::require_usable(const char* call) const { usable(impl_).require_usable(call); }

BufferRegistration::~BufferRegistration() { reset(); }

BufferRegistration::BufferRegistration(BufferRegistration&& other) noexcept
    : comm_(std::move(other.comm_)), handle_(std::exchange(other.handle_, nullptr)) {}

BufferRegistration& BufferRegistration::operator=(BufferRegistration&& other) noexcept {
  if (this != &other) {
    reset();
    comm_ = std::move(other.comm_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void BufferRegistration::reset() noexcept {
  if (handle_ != nullptr) comm_->deregister_buffer(std::exchange(handle_, nullptr));
  comm_.reset();
}

namespace detail {
void provoke_backend_error_for_test(const Communicator& comm) { CommAccess::require(comm).provoke_backend_error_for_test(); }
void inject_fault_for_test(const Communicator& comm, InjectedFault fault, int after) {
  CommAccess::require(comm).inject_fault_for_test(fault, after);
}
}  // namespace detail

}  // namespace shardopt
