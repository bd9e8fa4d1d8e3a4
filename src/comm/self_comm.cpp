// The one-rank group: every collective over one rank leaves the data as it is (a sum or
// maximum of one value is that value; an average divides by 1), so nothing is enqueued.
#include <memory>

#include "comm/comm_impl.hpp"
#include "core/check.hpp"
#include "core/device_guard.hpp"
#include "core/memory.hpp"

namespace shardopt::detail {
namespace {

class SelfCommImpl final : public CommImpl {
 public:
  SelfCommImpl(Backend backend, int device) : CommImpl(backend, 0, 1, device) {}

  bool can_inject_faults() const noexcept override { return false; }

 protected:
  void do_reduce_scatter(void*, std::int64_t, DType, ReduceOp, Stream) override {}
  void do_all_gather(void*, std::int64_t, DType, Stream) override {}
  void do_all_reduce(void*, std::int64_t, DType, ReduceOp, Stream) override {}
  // One rank: its one piece goes to itself (or nowhere, without the own piece).
  void do_all_to_all(const void* send, void* recv, std::int64_t count, DType dtype, Stream stream, bool own,
                     std::int64_t, std::int64_t) override {
    if (!own) return;
    DeviceGuard guard(device());
    copy_async(backend(), recv, send, static_cast<std::size_t>(count) * size_of(dtype), stream);
  }
  void do_barrier() override {}
  std::shared_ptr<CommImpl> do_split(int, int) override {
    return std::make_shared<SelfCommImpl>(backend(), device());
  }
  std::vector<std::uint64_t> do_all_gather_u64(const std::vector<std::uint64_t>& mine) override { return mine; }
  void do_invalid_call_for_test() override {
    SHARDOPT_REQUIRE(false, ErrorCode::InvalidArgument, "invalid datatype handed to the one-rank backend (test)");
  }
};

}  // namespace

std::shared_ptr<CommImpl> make_self_comm(Backend backend) {
  int device = -1;
  if (backend == Backend::Cuda) {
    if (!cuda_compiled()) no_cuda("Communicator::self");
    SHARDOPT_REQUIRE(cuda_device_count() > 0, ErrorCode::Unsupported,
                     "Communicator::self(Backend::Cuda) needs a CUDA device; none is visible");
    device = current_device();
  }
  return std::make_shared<SelfCommImpl>(backend, device);
}

}  // namespace shardopt::detail
