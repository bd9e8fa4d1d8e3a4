// shardopt/bucket_store.hpp - the flat parameter and gradient buffers of a layout, and
// their bucketed collectives.
//
// One flat allocation per layout buffer (params) and one per layout buffer (grads),
// identical on every rank. Gradients are reduce-scattered in place per bucket (rank r's
// reduced slice lands in slice r of the bucket) and parameters are all-gathered in place
// per bucket. Collectives run on the store's communication stream, ordered against the
// caller's compute stream with events; all of it works under CUDA stream capture.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "shardopt/backend.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/layout.hpp"

namespace shardopt {

/// Options of a BucketStore.
struct BucketStoreOptions {
  /// Element type of the gradient buffers: f32 (main grads) or bf16/f16 (decoupled).
  DType grad_dtype = DType::f32;
  /// Allocate full parameter buffers (false when another format owns the params).
  bool with_params = true;
  /// CUDA: allocate with ncclMemAlloc and register with the communicator (zero-copy
  /// NCCL paths); false: cudaMalloc.
  bool nccl_registered = true;
  /// Reduction of the gradient reduce-scatter.
  ReduceOp grad_reduce = ReduceOp::Average;
};

namespace detail {
class BucketStoreImpl;
}

/// Flat buffers + bucketed reduce-scatter / all-gather.
class BucketStore {
 public:
  /// Checks that every rank has the same layout (Communicator::check_layout), then
  /// allocates and zeroes the buffers.
  BucketStore(Communicator comm, Layout layout, BucketStoreOptions options = {});
  ~BucketStore();
  BucketStore(BucketStore&&) noexcept;
  BucketStore& operator=(BucketStore&&) noexcept;

  const Layout& layout() const noexcept;
  const Communicator& comm() const noexcept;
  const BucketStoreOptions& options() const noexcept;

  /// Base of the flat parameter / gradient buffer of layout buffer `buffer` (nullptr for
  /// params when with_params is false).
  void* param_buffer(int buffer) const;
  void* grad_buffer(int buffer) const;
  /// First element of parameter `param` in its buffer.
  void* param_data(int param) const;
  void* grad_data(int param) const;
  /// Bytes allocated for params and for grads (padding included), and the part of those
  /// that the allocator added on top (ncclMemAlloc granularity).
  std::size_t param_bytes() const noexcept;
  std::size_t grad_bytes() const noexcept;
  std::size_t allocator_overhead_bytes() const noexcept;

  /// Starts the reduce-scatter of bucket `bucket`'s gradients after the work queued so
  /// far on `stream`. Throws Error(InvalidState) if it was started and not waited.
  void start_grad_reduce(int bucket, Stream stream);
  /// Makes `stream` wait for the bucket's reduce-scatter.
  void wait_grad_reduce(int bucket, Stream stream);
  /// Starts the all-gather of bucket `bucket`'s parameters after the work queued so far
  /// on `stream` (which wrote this rank's slice).
  void start_param_gather(int bucket, Stream stream);
  /// Makes `stream` wait for the bucket's all-gather.
  void wait_param_gather(int bucket, Stream stream);
  /// Reports that parameter `param`'s gradient is complete on `stream`; when every
  /// parameter of its bucket has reported, the bucket's reduce-scatter starts. Each
  /// parameter reports at most once per round (Error(InvalidState) otherwise).
  void grad_ready(int param, Stream stream);
  /// True while bucket's reduce-scatter was started and not yet waited for.
  bool grad_reduce_pending(int bucket) const;
  bool param_gather_pending(int bucket) const;

  /// The store's communication stream (nullptr on the host backend).
  Stream comm_stream() const noexcept;

 private:
  std::unique_ptr<detail::BucketStoreImpl> impl_;
};

}  // namespace shardopt
