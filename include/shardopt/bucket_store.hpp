// shardopt/bucket_store.hpp - the flat parameter and gradient buffers of a layout, and
// their bucketed collectives.
//
// One flat allocation per layout buffer (params) and one per layout buffer (grads),
// identical on every rank. Gradients are reduce-scattered in place per bucket (rank r's
// reduced slice lands in slice r of the bucket; the other slices keep their values) and
// parameters are all-gathered in place per bucket. Collectives run on the store's
// communication stream, ordered against the caller's compute stream with events; all
// of it works under CUDA stream capture.
//
// Pairing: every start of a bucket is followed by exactly one wait of it (starting a
// pending bucket, or waiting one that is not pending, throws Error(InvalidState)). Under
// capture a start and its wait must lie in the same capture: the wait joins the
// communication stream back into the captured stream (a start made outside the capture
// that waits for it, or the reverse, is Error(InvalidState) at the wait). On the host backend the
// collectives run in order on the caller's HostStream and waits only keep the books.
//
// Construction is collective over the communicator: every rank checks that all ranks
// pass the same options and layout (else every rank throws), allocates and zeroes the
// buffers, registers them with NCCL (nccl_registered) and runs every bucket's
// collectives once eagerly (NCCL connects lazily; a captured collective must not be
// the first of its kind).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

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
  /// NCCL paths); false: cudaMalloc. (bench_comm measures both; see bench/results.)
  bool nccl_registered = true;
  /// Reduction of the gradient reduce-scatter.
  ReduceOp grad_reduce = ReduceOp::Average;
  /// How the gradient reduce-scatter adds (shardopt/communicator.hpp): Native is the
  /// backend's reduce-scatter; F32Accumulate is an all-to-all of the bucket's pieces in
  /// grad_dtype into a scratch buffer (one bucket's size, allocated at construction), then
  /// the fp32 sum in rank order, divided once by the world size for Average and rounded
  /// once to grad_dtype into this rank's slice (the other slices keep their values, as
  /// with Native). Deterministic: the same bits on every run, NCCL algorithm and backend.
  /// start_grad_reduces then starts the buckets one after another (an all-to-all and a
  /// sum each) instead of as one NCCL group.
  GradReducePrecision grad_reduce_precision = GradReducePrecision::Native;
  /// F32Accumulate only: each bucket's all-to-all and sum run in this many chunks, the
  /// sum of one chunk beside the all-to-all of the next (docs/grad_reduce.md); the bits
  /// do not depend on it. 1 (the default): one chunk, no pipelining -- on 2 x H200 the
  /// store ran faster unchunked at every bucket size measured (16 MiB to 1 GiB;
  /// docs/grad_reduce.md). 0 chooses per bucket from its size: one chunk per 4 MiB of a
  /// rank's piece, 1 to 4. 2 to 16: that many (fewer where a piece is shorter than that
  /// many 256-element chunks). Else Error(InvalidArgument).
  int grad_reduce_chunks = 1;
  /// Per layout buffer (one entry per buffer, or empty): false gives that buffer no
  /// parameter buffer (its params are in another format, e.g. MXFP8). A buffer has
  /// parameters when with_params is true and its entry, if any, is true.
  std::vector<bool> buffer_params;
  /// Staged transport for buffers without parameters: start_param_gather of such a
  /// bucket all-gathers, in place and as bytes, staged_gather_bytes * S bytes per rank
  /// of the bucket's gradient region (S = bucket elements / world; rank r's piece at byte
  /// r * staged_gather_bytes * S of the region). The region is free between the
  /// optimizer step and the next backward; its owner writes the pieces and zeroes the
  /// region afterwards. 0: such buckets have no parameter gather. Must be at most
  /// size_of(grad_dtype) (the region's bytes per element), else Error(InvalidArgument).
  int staged_gather_bytes = 0;
  /// Per bucket (one entry per bucket, or empty): when given, the staged all-gather of
  /// bucket b moves staged_gather_rank_bytes[b] bytes per rank (rank r's piece at byte
  /// r * staged_gather_rank_bytes[b] of the region) instead of staged_gather_bytes * S:
  /// for formats whose bytes per element are not a whole number (NVFP4: half a byte, plus
  /// the bytes two ranks share at odd boundaries). Entries of buckets with parameter
  /// buffers are ignored; the others must be 1 to S * size_of(grad_dtype).
  std::vector<std::int64_t> staged_gather_rank_bytes;
};

/// One plane of a bucket's own in-place all-gather (BucketStore::set_gather_planes).
struct GatherPlane {
  /// world * rank_bytes bytes of device memory (host memory on the host backend),
  /// 16-byte aligned; rank r's piece is bytes [r * rank_bytes, (r + 1) * rank_bytes).
  void* data = nullptr;
  /// Bytes of each rank's piece (at least 1).
  std::int64_t rank_bytes = 0;
};

namespace detail {
class BucketStoreImpl;
}

/// Flat buffers + bucketed reduce-scatter / all-gather.
class BucketStore {
 public:
  /// Checks that every rank has the same options (Error(LayoutMismatch) naming them) and
  /// layout (check_layout, shardopt/layout.hpp), then allocates and zeroes the buffers.
  /// Collective. Error(InvalidArgument) for a grad_dtype other than f32/bf16/f16 or a
  /// grad_reduce other than Sum/Average.
  BucketStore(Communicator comm, Layout layout, BucketStoreOptions options = {});
  ~BucketStore();
  BucketStore(BucketStore&&) noexcept;
  BucketStore& operator=(BucketStore&&) noexcept;

  /// The layout, communicator and options the store was built with.
  const Layout& layout() const noexcept;
  const Communicator& comm() const noexcept;
  const BucketStoreOptions& options() const noexcept;

  /// Base of the flat parameter / gradient buffer of layout buffer `buffer` (nullptr for
  /// params when the buffer has none: with_params false, or buffer_params[buffer] false).
  void* param_buffer(int buffer) const;
  void* grad_buffer(int buffer) const;
  /// First element of parameter `param` in its buffer.
  void* param_data(int param) const;
  void* grad_data(int param) const;
  /// Bytes of the params and of the grads (padding included), and what the allocator
  /// added on top of them (ncclMemAlloc's granularity; host: 256-byte rounding).
  std::size_t param_bytes() const noexcept;
  /// True when layout buffer `buffer` has a parameter buffer.
  bool has_params(int buffer) const;
  std::size_t grad_bytes() const noexcept;
  /// Bytes of the F32Accumulate receive buffer (the largest bucket in grad_dtype; 0 with
  /// Native or on one rank).
  std::size_t reduce_scratch_bytes() const noexcept;
  /// The chunks of bucket `bucket`'s F32Accumulate reduce (grad_reduce_chunks, or the
  /// automatic choice, cut to the piece's length); 1 with Native or on one rank.
  int grad_reduce_chunks(int bucket) const;
  std::size_t allocator_overhead_bytes() const noexcept;

  /// Starts the reduce-scatter of bucket `bucket`'s gradients after the work queued so
  /// far on `stream`. Throws Error(InvalidState) if it was started and not waited,
  /// Error(OutOfRange) for a bad index, Error(InvalidArgument) for a stream of another
  /// device, Error(InvalidState) when the communicator has failed.
  void start_grad_reduce(int bucket, Stream stream);
  /// Makes `stream` wait for the bucket's reduce-scatter (Error(InvalidState) if none is
  /// pending). `stream` may differ from the one that started it.
  void wait_grad_reduce(int bucket, Stream stream);
  /// Starts the all-gather of bucket `bucket`'s parameters after the work queued so far
  /// on `stream` (which wrote this rank's slice); for a buffer without parameters, the
  /// in-place gather of its own planes (set_gather_planes) or else the staged all-gather
  /// of its gradient region (BucketStoreOptions::staged_gather_bytes; Error(InvalidState)
  /// when that is 0).
  void start_param_gather(int bucket, Stream stream);
  /// Makes `stream` wait for the bucket's all-gather.
  void wait_param_gather(int bucket, Stream stream);
  /// Starts, together, the reduce-scatters of the buckets in [first, last) that are not
  /// pending (the rest of a step after grad_ready started some). On CUDA they form one
  /// NCCL group on the comm stream: one launch, NCCL spreads the buckets over its
  /// channels, closer to the bandwidth of one call over all their bytes. Each started
  /// bucket is then pending as after start_grad_reduce (wait each one).
  void start_grad_reduces(int first, int last, Stream stream);
  /// The same for the parameter all-gathers of [first, last).
  void start_param_gathers(int first, int last, Stream stream);
  /// Gives bucket `bucket` of a layout buffer without parameters (buffer_params) a gather
  /// of its own: from now on its start_param_gather(s) all-gathers each plane in place,
  /// as bytes (one collective per plane, in one NCCL group with the other buckets
  /// started together; wait_param_gather as for any bucket), instead of the staged gather
  /// through its gradient region, which the store then never writes. For storage that
  /// every rank keeps whole anyway (DistributedAdam's MXFP8 data planes): the gather
  /// lands where the bytes are read, with no staging, copy or zeroing. The memory stays
  /// the caller's: it must outlive every gather of the bucket (the store's destructor
  /// only waits for its communication stream). Collective: every rank passes the same
  /// bucket and byte counts; on CUDA each plane's gather then runs once eagerly (NCCL
  /// connects lazily: a captured gather must not be the first of its kind), which moves
  /// the planes' current bytes as any gather would. Errors: Error(OutOfRange) for a bad
  /// bucket; Error(InvalidArgument) when its buffer has parameters, for no planes or more
  /// than 8, a null or not 16-byte aligned plane, or rank_bytes below 1;
  /// Error(InvalidState) when the bucket already has planes or its gather is pending;
  /// Error(LayoutMismatch) when the ranks pass different buckets or byte counts (every
  /// rank throws the first error of any rank).
  void set_gather_planes(int bucket, const std::vector<GatherPlane>& planes);
  /// True when bucket `bucket` gathers into planes of its own (set_gather_planes).
  bool has_gather_planes(int bucket) const;
  /// Reports that parameter `param`'s gradient is complete on `stream`; when every
  /// parameter of its bucket has reported, the bucket's reduce-scatter starts (on the
  /// stream of that last report). Each parameter reports at most once per round, and not
  /// while its bucket is pending (Error(InvalidState)); the round of a bucket ends when
  /// its reduce-scatter is waited for. All parameters of a bucket report on one stream
  /// (Error(InvalidArgument) otherwise).
  void grad_ready(int param, Stream stream);
  /// True while bucket's reduce-scatter was started and not yet waited for.
  bool grad_reduce_pending(int bucket) const;
  bool param_gather_pending(int bucket) const;

  /// An in-place all-reduce (Communicator::all_reduce's dtypes and ops) ordered with the
  /// store's bucket collectives: on CUDA it runs on the store's communication stream,
  /// after the work queued so far on `stream` and behind every collective already started
  /// there, and `stream` waits for it (capturable, like the bucket calls); on the host
  /// backend it runs on `stream`. The one way for code beside the store (MXFP8 scales) to
  /// add a collective, so that every rank issues all of them in one order.
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream);

  /// The store's communication stream (nullptr on the host backend).
  ///
  /// A moved-from store may only be destroyed or assigned to; its other calls throw
  /// Error(InvalidState) (the noexcept accessors above must not be called on it).
  Stream comm_stream() const noexcept;

 private:
  std::unique_ptr<detail::BucketStoreImpl> impl_;
};

}  // namespace shardopt
