// BucketStore: the flat parameter and gradient buffers of a layout, and their bucketed
// reduce-scatter / all-gather.
//
// CUDA: the collectives run on the store's communication stream (non-blocking, one for
// all buckets so that every rank issues them to NCCL in the same order). start_* records
// the bucket's start event on the caller's stream, makes the comm stream wait for it,
// enqueues the collective and records the bucket's done event on the comm stream;
// wait_* makes the caller's stream wait for the done event. Under stream capture this is
// a legal fork/join: every start must be waited (joined) before the capture ends.
// Host backend: the collectives run in order on the caller's HostStream; waits only
// update the bookkeeping.
#include "shardopt/bucket_store.hpp"

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "buffers/piece_reduce.hpp"
#include "comm/deadline.hpp"
#include "core/device_guard.hpp"
#include "core/fnv.hpp"
#include "core/memory.hpp"
#include "core/streams.hpp"
#include "core/trace.hpp"
#include "kernels/common/kernel_files.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace detail {
namespace {

// The store options as one number, so that ranks can compare them in one all-gather:
// bits 0-7 grad dtype, 8 with_params, 9 nccl_registered, 10-11 grad_reduce,
// 12 grad_reduce_precision F32Accumulate, 16 valid,
// 17-20 staged_gather_bytes, 24-31 buffer_params entries, 32-63 their values (a layout
// has one buffer per parameter dtype, so a few entries; the constructor checks the count).
std::uint64_t encode(const BucketStoreOptions& o, bool valid) {
  std::uint64_t mask = 0;
  for (std::size_t i = 0; i < o.buffer_params.size() && i < 32; ++i)
    if (o.buffer_params[i]) mask |= 1ull << i;
  const auto entries = static_cast<std::uint64_t>(std::min<std::size_t>(o.buffer_params.size(), 255));
  const auto staged = static_cast<std::uint64_t>(std::clamp(o.staged_gather_bytes, 0, 15));
  return static_cast<std::uint64_t>(o.grad_dtype) | (o.with_params ? 1ull << 8 : 0) |
         (o.nccl_registered ? 1ull << 9 : 0) | (static_cast<std::uint64_t>(o.grad_reduce) << 10) |
         (o.grad_reduce_precision == GradReducePrecision::F32Accumulate ? 1ull << 12 : 0) |
         (valid ? 1ull << 16 : 0) | (staged << 17) | (o.staged_gather_rank_bytes.empty() ? 0 : 1ull << 21) |
         (entries << 24) | (mask << 32);
}

// BucketStoreOptions::grad_reduce_chunks at most.
constexpr int kMaxGradReduceChunks = 16;
// Planes of one bucket's own gather (set_gather_planes) at most.
constexpr std::size_t kMaxGatherPlanes = 8;

std::string describe_options(std::uint64_t v, std::uint64_t chunks) {
  const auto dtype = static_cast<DType>(v & 0xFF);
  std::string params;
  const auto entries = static_cast<int>((v >> 24) & 0xFF);
  for (int i = 0; i < entries && i < 32; ++i) params += (v >> (32 + i)) & 1 ? '1' : '0';
  return std::string("grad_dtype=") + to_string(dtype) + " with_params=" + ((v >> 8) & 1 ? "true" : "false") +
         " nccl_registered=" + ((v >> 9) & 1 ? "true" : "false") +
         " grad_reduce=" + to_string(static_cast<ReduceOp>((v >> 10) & 3)) + " grad_reduce_precision=" +
         ((v >> 12) & 1 ? "F32Accumulate" : "Native") +
         " staged_gather_bytes=" + std::to_string((v >> 17) & 15) +
         " staged_gather_rank_bytes=" + ((v >> 21) & 1 ? "per bucket" : "unset") + " buffer_params=[" + params + "]" +
         " grad_reduce_chunks=" + std::to_string(chunks);
}

// FNV-1a of the per-bucket staged byte counts, for the ranks' agreement.
std::uint64_t hash_of(const std::vector<std::int64_t>& v) {
  detail::Fnv f;
  for (std::int64_t x : v) f.i64(x);
  return f.h;
}

}  // namespace

class BucketStoreImpl {
 public:
  BucketStoreImpl(Communicator c, Layout l, BucketStoreOptions o)
      : comm(std::move(c)), layout(std::move(l)), options(o) {
    SHARDOPT_REQUIRE(comm.valid(), ErrorCode::InvalidArgument, "BucketStore needs a valid Communicator");
    agree_on_options();
    check_layout(comm, layout);  // collective; LayoutMismatch on every rank
    backend = comm.backend();
    device = comm.device();
    const auto nbuckets = layout.buckets().size();
    grad_pending.assign(nbuckets, 0);
    gather_pending.assign(nbuckets, 0);
    grad_capture.assign(nbuckets, 0);
    gather_capture.assign(nbuckets, 0);
    ready_count.assign(nbuckets, 0);
    ready_stream.assign(nbuckets, nullptr);
    reported.assign(layout.params().size(), 0);
    chunks.assign(nbuckets, 1);
    planes.assign(nbuckets, {});
    // A rank whose allocation fails tells the others, which would otherwise wait for
    // it in the warm-up collectives.
    std::exception_ptr error;
    try {
      if (backend == Backend::Cuda) {
        setup_cuda();
      } else {
        allocate(MemoryKind::Host, nullptr);
      }
    } catch (...) {
      error = std::current_exception();
    }
    const std::vector<std::uint64_t> ok = comm.all_gather_value(error ? 0 : 1);
    if (error) std::rethrow_exception(error);
    for (std::size_t r = 0; r < ok.size(); ++r)
      SHARDOPT_REQUIRE(ok[r] == 1, ErrorCode::InvalidState,
                       "BucketStore: allocating the buffers failed on rank " + std::to_string(r) +
                           " (see its error); every rank gives up");
    if (backend == Backend::Cuda) warm_up();
  }

  ~BucketStoreImpl() {
    if (stream == nullptr) return;
    try {
      synchronize(backend, stream->get());
    } catch (...) {  // a destructor does not throw
    }
  }

  // ---------------------------------------------------------------- state
  Communicator comm;
  Layout layout;
  BucketStoreOptions options;
  Backend backend = Backend::Host;
  int device = -1;
  std::vector<DeviceBuffer> params;  // per layout buffer (empty buffers without params)
  std::vector<DeviceBuffer> grads;
  DeviceBuffer pieces;  // F32Accumulate: the all-to-all's receive buffer, one bucket's size
  std::vector<int> chunks;  // F32Accumulate: per bucket, the chunks of its pipelined reduce
  std::unique_ptr<detail::PieceReducer> reducer;  // F32Accumulate on 2+ ranks
  std::size_t scratch_bytes = 0;  // pieces
  std::size_t param_bytes = 0;
  std::size_t grad_bytes = 0;
  std::size_t overhead_bytes = 0;
  std::vector<BufferRegistration> registrations;  // destroyed before the buffers
  std::unique_ptr<SideStream> stream;             // the comm stream (CUDA only)
  std::vector<Event> reduce_start, reduce_done, gather_start, gather_done;  // per bucket (CUDA only)
  std::unique_ptr<Event> extra_start, extra_done;  // all_reduce (CUDA only)
  std::vector<std::uint8_t> grad_pending;
  std::vector<std::uint8_t> gather_pending;
  std::vector<std::uint64_t> grad_capture;    // capture of the pending start (0: none)
  std::vector<std::uint64_t> gather_capture;
  std::vector<std::size_t> ready_count;  // params of the bucket reported in this round
  std::vector<Stream> ready_stream;      // the stream the bucket's params report on
  std::vector<std::uint8_t> reported;    // per param, in this round
  std::vector<std::vector<GatherPlane>> planes;  // per bucket, its own gather (set_gather_planes)

  Stream comm_stream() const noexcept { return stream != nullptr ? stream->get() : nullptr; }

  // ---------------------------------------------------------------- checks
  const Bucket& bucket(int b, const char* call) const {
    const int n = static_cast<int>(layout.buckets().size());
    SHARDOPT_REQUIRE(b >= 0 && b < n, ErrorCode::OutOfRange,
                     std::string("BucketStore::") + call + ": bucket " + std::to_string(b) + " is out of range [0, " +
                         std::to_string(n) + ")");
    return layout.buckets()[static_cast<std::size_t>(b)];
  }

  void check_buffer(int buffer, const char* call) const {
    const int n = static_cast<int>(layout.buffers().size());
    SHARDOPT_REQUIRE(buffer >= 0 && buffer < n, ErrorCode::OutOfRange,
                     std::string("BucketStore::") + call + ": buffer " + std::to_string(buffer) +
                         " is out of range [0, " + std::to_string(n) + ")");
  }

  // Whether layout buffer `buffer` has a parameter buffer.
  bool buffer_has_params(int buffer) const {
    return options.with_params &&
           (options.buffer_params.empty() || options.buffer_params[static_cast<std::size_t>(buffer)]);
  }

  const ParamPlacement& param(int p, const char* call) const {
    const int n = static_cast<int>(layout.params().size());
    SHARDOPT_REQUIRE(p >= 0 && p < n, ErrorCode::OutOfRange,
                     std::string("BucketStore::") + call + ": parameter " + std::to_string(p) +
                         " is out of range [0, " + std::to_string(n) + ")");
    return layout.params()[static_cast<std::size_t>(p)];
  }

  // Refuses work on a failed group before anything is enqueued.
  void require_comm(const char* call) const { comm.require_usable(call); }

  // ---------------------------------------------------------------- collectives
  void start(int b, Stream caller, bool reduce) {
    (void)bucket(b, reduce ? "start_grad_reduce" : "start_param_gather");
    SHARDOPT_REQUIRE(!(reduce ? grad_pending : gather_pending)[static_cast<std::size_t>(b)], ErrorCode::InvalidState,
                     std::string(reduce ? "start_grad_reduce" : "start_param_gather") + "(" + std::to_string(b) +
                         "): the bucket's " + (reduce ? "reduce-scatter" : "all-gather") +
                         " was started and not waited for; call " +
                         (reduce ? "wait_grad_reduce" : "wait_param_gather") + " first");
    launch({b}, caller, reduce);
  }

  // The buckets of [first, last) that are not pending, started together.
  void start_range(int first, int last, Stream caller, bool reduce) {
    const int n = static_cast<int>(layout.buckets().size());
    SHARDOPT_REQUIRE(0 <= first && first <= last && last <= n, ErrorCode::OutOfRange,
                     std::string(reduce ? "start_grad_reduces" : "start_param_gathers") + ": bucket range [" +
                         std::to_string(first) + ", " + std::to_string(last) + ") is not within [0, " +
                         std::to_string(n) + "]");
    const auto& pending = reduce ? grad_pending : gather_pending;
    std::vector<int> buckets;
    for (int b = first; b < last; ++b)
      if (!pending[static_cast<std::size_t>(b)]) buckets.push_back(b);
    launch(buckets, caller, reduce);
  }

  // Starts the collectives of `buckets` (none pending) after the work queued on
  // `caller`: one event on the caller's stream, then one group of collectives on the
  // comm stream, then each bucket's done event.
  void launch(const std::vector<int>& buckets, Stream caller, bool reduce) {
    const char* call = reduce ? "start_grad_reduce" : "start_param_gather";
    if (!reduce) {
      for (int b : buckets) {
        const int buf = layout.buckets()[static_cast<std::size_t>(b)].buffer;
        SHARDOPT_REQUIRE(buffer_has_params(buf) || staged() || !planes[static_cast<std::size_t>(b)].empty(),
                         ErrorCode::InvalidState,
                         "start_param_gather(" + std::to_string(b) + "): layout buffer " + std::to_string(buf) +
                             " has no parameter buffer (BucketStoreOptions::with_params / buffer_params), the "
                             "bucket has no gather planes (set_gather_planes) and staged_gather_bytes is 0, so "
                             "the bucket has nothing to gather");
      }
    }
    require_comm(call);
    check_stream_device(backend, device, caller);
    if (buckets.empty()) return;

    auto run = [&](int b, Stream s) {
      SHARDOPT_TRACE_EITHER(reduce, "shardopt/reduce_scatter bucket", "shardopt/all_gather bucket", b);
      // Host backend: the text names the bucket if this collective misses a deadline.
      std::optional<detail::OperationLabel> label;
      if (backend == Backend::Host)
        label.emplace("bucket " + std::to_string(b) + (reduce ? " gradient reduce-scatter" : " parameter all-gather"));
      const Bucket& bk = layout.buckets()[static_cast<std::size_t>(b)];
      const auto buf = static_cast<std::size_t>(bk.buffer);
      const std::int64_t per_rank = bk.range.size() / comm.size();
      if (reduce) {
        reduce_bucket(bk, s);
      } else if (buffer_has_params(bk.buffer)) {
        const DType dtype = layout.buffers()[buf].dtype;
        char* data = params[buf].as<char>() + static_cast<std::size_t>(bk.range.begin) * size_of(dtype);
        comm.all_gather(data, per_rank, dtype, s);
      } else if (!planes[static_cast<std::size_t>(b)].empty()) {  // its own planes, in place, as bytes
        for (const GatherPlane& pl : planes[static_cast<std::size_t>(b)])
          comm.all_gather(pl.data, pl.rank_bytes, DType::e4m3, s);
      } else {  // staged: bytes through the bucket's gradient region
        char* data = grads[buf].as<char>() + static_cast<std::size_t>(bk.range.begin) * size_of(options.grad_dtype);
        comm.all_gather(data, staged_rank_bytes(b, per_rank), DType::e4m3, s);
      }
    };
    // F32Accumulate: each bucket's all-to-all feeds a kernel, which cannot sit inside an
    // NCCL group, and the buckets share one receive buffer: one bucket after another.
    const bool one_by_one = reduce && f32_accumulate();
    if (backend == Backend::Host) {
      if (one_by_one) {
        for (int b : buckets) run(b, caller);
      } else {
        comm.grouped([&] {
          for (int b : buckets) run(b, caller);
        });
      }
    } else {
      DeviceGuard guard(device);
      Event& started = (reduce ? reduce_start : gather_start)[static_cast<std::size_t>(buckets.front())];
      started.record(caller);
      started.wait(comm_stream());
      // One collective alone; several (buckets, or one bucket's planes) as one group.
      const bool alone = buckets.size() == 1 && (reduce || planes[static_cast<std::size_t>(buckets.front())].size() <= 1);
      if (alone || one_by_one) {
        for (int b : buckets) run(b, comm_stream());
      } else {
        comm.grouped([&] {
          for (int b : buckets) run(b, comm_stream());
        });
      }
      for (int b : buckets) (reduce ? reduce_done : gather_done)[static_cast<std::size_t>(b)].record(comm_stream());
    }
    auto& pending = reduce ? grad_pending : gather_pending;
    auto& captured = reduce ? grad_capture : gather_capture;
    const std::uint64_t capture = capture_id(backend, caller);
    for (int b : buckets) {
      pending[static_cast<std::size_t>(b)] = 1;
      captured[static_cast<std::size_t>(b)] = capture;
    }
  }

  void wait(int b, Stream caller, bool reduce) {
    const Bucket& bk = bucket(b, reduce ? "wait_grad_reduce" : "wait_param_gather");
    auto& pending = reduce ? grad_pending : gather_pending;
    SHARDOPT_REQUIRE(pending[static_cast<std::size_t>(b)], ErrorCode::InvalidState,
                     std::string(reduce ? "wait_grad_reduce" : "wait_param_gather") + "(" + std::to_string(b) +
                         "): no " + (reduce ? "reduce-scatter" : "all-gather") +
                         " of this bucket is pending; call " +
                         (reduce ? "start_grad_reduce (or report every param with grad_ready)" : "start_param_gather") +
                         " first, and wait once per start");
    check_stream_device(backend, device, caller);
    const std::uint64_t started_in = (reduce ? grad_capture : gather_capture)[static_cast<std::size_t>(b)];
    const std::uint64_t waiting_in = capture_id(backend, caller);
    SHARDOPT_REQUIRE(started_in == waiting_in, ErrorCode::InvalidState,
                     std::string(reduce ? "wait_grad_reduce" : "wait_param_gather") + "(" + std::to_string(b) +
                         "): the bucket's " + (reduce ? "reduce-scatter" : "all-gather") + " was started " +
                         (started_in == 0 ? "outside any capture" : "inside a capture") + " but is waited for " +
                         (waiting_in == 0 ? "outside any capture" : started_in == 0 ? "inside a capture" : "inside another capture") +
                         "; a CUDA graph cannot depend on work outside it: wait before the capture begins, or start "
                         "and wait inside the same capture");
    if (backend == Backend::Cuda) {
      DeviceGuard guard(device);
      (reduce ? reduce_done : gather_done)[static_cast<std::size_t>(b)].wait(caller);
    }
    pending[static_cast<std::size_t>(b)] = 0;
    if (reduce) {  // the next round of grad_ready begins
      ready_count[static_cast<std::size_t>(b)] = 0;
      ready_stream[static_cast<std::size_t>(b)] = nullptr;
      for (int p : bk.params) reported[static_cast<std::size_t>(p)] = 0;
    }
  }

  // BucketStore::set_gather_planes: checked on every rank, agreed in one all-gather (each
  // rank's error code + 1, or 0, and a hash of the bucket and byte counts), then set
  // and, on CUDA, run once eagerly, alone and grouped.
  void set_gather_planes(int b, const std::vector<GatherPlane>& given) {
    require_comm("set_gather_planes");
    const int n = static_cast<int>(layout.buckets().size());
    std::string problem;
    ErrorCode code = ErrorCode::InvalidArgument;
    if (b < 0 || b >= n) {
      problem = "bucket " + std::to_string(b) + " is out of range [0, " + std::to_string(n) + ")";
      code = ErrorCode::OutOfRange;
    } else if (buffer_has_params(layout.buckets()[static_cast<std::size_t>(b)].buffer)) {
      problem = "the bucket's layout buffer has a parameter buffer, which its gather fills; gather planes are for "
                "buffers without parameters (BucketStoreOptions::buffer_params)";
    } else if (given.empty() || given.size() > kMaxGatherPlanes) {
      problem = std::to_string(given.size()) + " planes given; give 1 to " + std::to_string(kMaxGatherPlanes);
    } else if (!planes[static_cast<std::size_t>(b)].empty()) {
      problem = "the bucket already has gather planes; give them once, after construction";
      code = ErrorCode::InvalidState;
    } else if (gather_pending[static_cast<std::size_t>(b)]) {
      problem = "the bucket's all-gather was started and not waited for; call wait_param_gather first";
      code = ErrorCode::InvalidState;
    }
    for (std::size_t i = 0; problem.empty() && i < given.size(); ++i) {
      const auto at = reinterpret_cast<std::uintptr_t>(given[i].data);
      if (given[i].data == nullptr || at % 16 != 0)
        problem = "plane " + std::to_string(i) + " is " + (at == 0 ? "null" : "not 16-byte aligned") +
                  "; give 16-byte aligned memory of world * rank_bytes bytes";
      else if (given[i].rank_bytes < 1)
        problem = "plane " + std::to_string(i) + " has rank_bytes " + std::to_string(given[i].rank_bytes) +
                  "; each rank's piece needs at least 1 byte";
    }
    detail::Fnv f;
    f.i64(b);
    for (const GatherPlane& pl : given) f.i64(pl.rank_bytes);
    const std::vector<std::uint64_t> all =
        comm.all_gather_values({problem.empty() ? 0 : static_cast<std::uint64_t>(code) + 1, f.h});
    SHARDOPT_REQUIRE(problem.empty(), code, "BucketStore::set_gather_planes(" + std::to_string(b) + "): " + problem);
    for (std::size_t r = 0; r < all.size(); r += 2)
      if (all[r] != 0)
        throw Error(static_cast<ErrorCode>(static_cast<int>(all[r] - 1)),
                    "BucketStore::set_gather_planes(" + std::to_string(b) + ") was refused on rank " +
                        std::to_string(r / 2) + " (see its error); every rank gives up");
    for (std::size_t r = 0; r < all.size(); r += 2)
      SHARDOPT_REQUIRE(all[r + 1] == all[1], ErrorCode::LayoutMismatch,
                       "BucketStore::set_gather_planes(" + std::to_string(b) + "): rank " + std::to_string(r / 2) +
                           " gives another bucket or other byte counts than rank 0; pass the same on every rank");
    planes[static_cast<std::size_t>(b)] = given;
    if (backend != Backend::Cuda || comm.size() == 1) return;
    DeviceGuard guard(device);
    auto gathers = [&] {
      for (const GatherPlane& pl : given) comm.all_gather(pl.data, pl.rank_bytes, DType::e4m3, comm_stream());
    };
    gathers();
    comm.grouped(gathers);
    comm.synchronize(comm_stream());
  }

  // An all-reduce ordered with the bucket collectives: on the comm stream, behind those
  // already started there and after the work queued on `caller`, which then waits for it.
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream caller) {
    require_comm("all_reduce");
    check_stream_device(backend, device, caller);
    if (backend == Backend::Host) {
      detail::OperationLabel label("MXFP8 scale all-reduce of the bucket store");
      comm.all_reduce(data, count, dtype, op, caller);
      return;
    }
    DeviceGuard guard(device);
    extra_start->record(caller);
    extra_start->wait(comm_stream());
    comm.all_reduce(data, count, dtype, op, comm_stream());
    extra_done->record(comm_stream());
    extra_done->wait(caller);
  }

  bool f32_accumulate() const noexcept {
    return options.grad_reduce_precision == GradReducePrecision::F32Accumulate;
  }

  // The gradient reduce-scatter of one bucket on stream `s`: the backend's (Native), or
  // an all-to-all of the other ranks' pieces into `pieces` and the rank-ordered fp32 sum
  // into this rank's slice, which holds this rank's own piece: the sum reads it there
  // (each element before it writes it), so no copy of it is made. In the bucket's chunks,
  // each sum beside the next chunk's all-to-all (piece_reduce.hpp).
  void reduce_bucket(const Bucket& bk, Stream s) {
    const std::int64_t per_rank = bk.range.size() / comm.size();
    const DType gd = options.grad_dtype;
    char* data = grads[static_cast<std::size_t>(bk.buffer)].as<char>() + static_cast<std::size_t>(bk.range.begin) * size_of(gd);
    if (!f32_accumulate()) {
      comm.reduce_scatter(data, per_rank, gd, options.grad_reduce, s);
      return;
    }
    if (comm.size() == 1 || per_rank == 0) return;  // one rank: the sum of one piece is the piece
    PieceReduce r;
    r.data = data;
    r.pieces = pieces.data();
    r.count = per_rank;
    r.dtype = gd;
    r.average = options.grad_reduce == ReduceOp::Average;
    r.out = data + static_cast<std::size_t>(comm.rank() * per_rank) * size_of(gd);
    r.out_dtype = gd;
    reducer->run(comm, r, chunks[static_cast<std::size_t>(&bk - layout.buckets().data())], s);
  }

  void grad_ready(int p, Stream caller) {
    const ParamPlacement& pl = param(p, "grad_ready");
    const auto b = static_cast<std::size_t>(pl.bucket);
    const std::string& name = layout.specs()[static_cast<std::size_t>(p)].name;
    SHARDOPT_REQUIRE(!reported[static_cast<std::size_t>(p)], ErrorCode::InvalidState,
                     "grad_ready: parameter '" + name +
                         "' reported twice in one round; each parameter reports once per step, and the round ends "
                         "when its bucket's reduce-scatter (bucket " +
                         std::to_string(pl.bucket) + ") is waited for");
    SHARDOPT_REQUIRE(!grad_pending[b], ErrorCode::InvalidState,
                     "grad_ready: parameter '" + name + "' reported while its bucket's reduce-scatter (bucket " +
                         std::to_string(pl.bucket) +
                         ") is already running; its gradient would be missed. Report before starting the bucket");
    SHARDOPT_REQUIRE(ready_count[b] == 0 || ready_stream[b] == caller, ErrorCode::InvalidArgument,
                     "grad_ready: parameter '" + name + "' reports on another stream than the earlier parameters of "
                     "bucket " + std::to_string(pl.bucket) +
                         "; report all parameters of a bucket on one stream (the one their gradients are written on)");
    check_stream_device(backend, device, caller);
    reported[static_cast<std::size_t>(p)] = 1;
    ready_stream[b] = caller;
    if (++ready_count[b] == layout.buckets()[b].params.size()) start(pl.bucket, caller, /*reduce=*/true);
  }

 private:
  // Every rank checks its options; then one all-gather tells every rank whether all are
  // valid and equal, so that no rank enters check_layout alone.
  void agree_on_options() {
    std::string problem;
    if (!is_float_storage(options.grad_dtype))
      problem = std::string("grad_dtype ") + to_string(options.grad_dtype) + " is not a gradient type; use f32, bf16 or f16";
    else if (options.grad_reduce != ReduceOp::Sum && options.grad_reduce != ReduceOp::Average)
      problem = std::string("grad_reduce ") + to_string(options.grad_reduce) + " is not a gradient reduction; use Sum or Average";
    else if (!options.buffer_params.empty() && options.buffer_params.size() != layout.buffers().size())
      problem = "buffer_params has " + std::to_string(options.buffer_params.size()) + " entries but the layout has " +
                std::to_string(layout.buffers().size()) + " buffers; give one entry per buffer (or none)";
    else if (options.staged_gather_bytes < 0 ||
             options.staged_gather_bytes > static_cast<int>(size_of(options.grad_dtype)))
      problem = "staged_gather_bytes " + std::to_string(options.staged_gather_bytes) +
                " does not fit the gradient buffer: a staged all-gather moves that many bytes per element through "
                "the bucket's gradient region, which holds " + std::to_string(size_of(options.grad_dtype)) +
                " bytes per element (grad_dtype " + to_string(options.grad_dtype) +
                "); use a wider grad_dtype or fewer staged bytes (0 to " +
                std::to_string(size_of(options.grad_dtype)) + ")";
    else if (options.grad_reduce_chunks < 0 || options.grad_reduce_chunks > kMaxGradReduceChunks)
      problem = "grad_reduce_chunks " + std::to_string(options.grad_reduce_chunks) + " is outside [0, " +
                std::to_string(kMaxGradReduceChunks) + "]; use 0 (chosen from the bucket size) or a chunk count";
    else if (!options.staged_gather_rank_bytes.empty())
      problem = check_rank_bytes();
    // Per rank: the encoded options, then grad_reduce_chunks (one all-gather).
    const std::vector<std::uint64_t> all = comm.all_gather_values(
        {encode(options, problem.empty()), static_cast<std::uint64_t>(static_cast<std::uint32_t>(options.grad_reduce_chunks))});
    SHARDOPT_REQUIRE(problem.empty(), ErrorCode::InvalidArgument, "BucketStoreOptions: " + problem);
    bool equal = true, valid = true;
    for (std::size_t r = 0; r < all.size(); r += 2) {
      equal = equal && all[r] == all[0] && all[r + 1] == all[1];
      valid = valid && ((all[r] >> 16) & 1);
    }
    SHARDOPT_REQUIRE(valid, ErrorCode::InvalidArgument, "BucketStoreOptions are invalid on another rank (see its error)");
    if (!equal) {
      std::string s;
      for (std::size_t r = 0; 2 * r < all.size(); ++r)
        s += (r ? "; rank " : "rank ") + std::to_string(r) + ": " + describe_options(all[2 * r], all[2 * r + 1]);
      throw Error(ErrorCode::LayoutMismatch, "ranks pass different BucketStoreOptions (" + s + "); pass the same options on every rank");
    }
    if (options.staged_gather_rank_bytes.empty()) return;
    const std::vector<std::uint64_t> hashes = comm.all_gather_value(hash_of(options.staged_gather_rank_bytes));
    for (std::uint64_t h : hashes)
      SHARDOPT_REQUIRE(h == hashes.front(), ErrorCode::LayoutMismatch,
                       "ranks pass different BucketStoreOptions::staged_gather_rank_bytes; pass the same on every rank");
  }

  // The per-bucket staged byte counts fit their buckets' gradient regions ("" if so).
  std::string check_rank_bytes() const {
    const auto& v = options.staged_gather_rank_bytes;
    if (v.size() != layout.buckets().size())
      return "staged_gather_rank_bytes has " + std::to_string(v.size()) + " entries but the layout has " +
             std::to_string(layout.buckets().size()) + " buckets; give one entry per bucket (or none)";
    for (std::size_t b = 0; b < v.size(); ++b) {
      const Bucket& bk = layout.buckets()[b];
      if (buffer_has_params(bk.buffer)) continue;
      const std::int64_t room = bk.range.size() / comm.size() * static_cast<std::int64_t>(size_of(options.grad_dtype));
      if (v[b] < 1 || v[b] > room)
        return "staged_gather_rank_bytes[" + std::to_string(b) + "] = " + std::to_string(v[b]) +
               " does not fit the bucket's gradient region (1 to " + std::to_string(room) +
               " bytes per rank); use a wider grad_dtype or fewer staged bytes";
    }
    return "";
  }

  // Buffers without parameters gather staged bytes.
  bool staged() const { return options.staged_gather_bytes > 0 || !options.staged_gather_rank_bytes.empty(); }

  // Bytes per rank of bucket b's staged all-gather.
  std::int64_t staged_rank_bytes(int b, std::int64_t per_rank) const {
    if (!options.staged_gather_rank_bytes.empty()) return options.staged_gather_rank_bytes[static_cast<std::size_t>(b)];
    return per_rank * options.staged_gather_bytes;
  }

  void allocate(MemoryKind kind, Stream zero_stream) {
    const auto& buffers = layout.buffers();
    for (const BufferLayout& buf : buffers) {
      const int index = static_cast<int>(&buf - buffers.data());
      const std::size_t pbytes =
          buffer_has_params(index) ? static_cast<std::size_t>(buf.numel) * size_of(buf.dtype) : 0;
      const std::size_t gbytes = static_cast<std::size_t>(buf.numel) * size_of(options.grad_dtype);
      params.emplace_back(backend, pbytes, kind);
      grads.emplace_back(backend, gbytes, kind);
      param_bytes += pbytes;
      grad_bytes += gbytes;
      fill_zero_async(backend, params.back().data(), pbytes, zero_stream);
      fill_zero_async(backend, grads.back().data(), gbytes, zero_stream);
      overhead_bytes += allocation_extent(params.back(), pbytes) - pbytes;
      overhead_bytes += allocation_extent(grads.back(), gbytes) - gbytes;
    }
    if (f32_accumulate() && comm.size() > 1) {
      std::int64_t largest = 0;
      for (const Bucket& bk : layout.buckets()) largest = std::max(largest, bk.range.size());
      const std::size_t bytes = static_cast<std::size_t>(largest) * size_of(options.grad_dtype);
      pieces = DeviceBuffer(backend, bytes, kind);
      fill_zero_async(backend, pieces.data(), bytes, zero_stream);
      scratch_bytes = bytes;
      overhead_bytes += allocation_extent(pieces, bytes) - bytes;
      int most = 1;
      for (const Bucket& bk : layout.buckets()) {
        const std::int64_t per_rank = bk.range.size() / comm.size();
        const int asked = options.grad_reduce_chunks > 0
                              ? options.grad_reduce_chunks
                              : auto_piece_chunks(static_cast<std::size_t>(per_rank) * size_of(options.grad_dtype));
        chunks[static_cast<std::size_t>(&bk - layout.buckets().data())] = std::max(1, piece_chunks(per_rank, asked).number);
        most = std::max(most, asked);
      }
      reducer = std::make_unique<PieceReducer>(backend, most);
    }
  }

  void setup_cuda() {
    SHARDOPT_REQUIRE(cuda_compiled(), ErrorCode::Unsupported, "BucketStore on Backend::Cuda: this build has no CUDA backend");
    DeviceGuard guard(device);
    stream = std::make_unique<SideStream>(backend);
    const auto nbuckets = layout.buckets().size();
    for (auto* events : {&reduce_start, &reduce_done, &gather_start, &gather_done}) {
      events->reserve(nbuckets);
      for (std::size_t i = 0; i < nbuckets; ++i) events->emplace_back(backend);
    }
    extra_start = std::make_unique<Event>(backend);
    extra_done = std::make_unique<Event>(backend);
    // Every kernel loads now, not lazily at its first launch behind a collective.
    kernels::load_step_kernels(backend);
    const bool registered = options.nccl_registered && nccl_compiled();
    allocate(registered ? MemoryKind::NcclDevice : MemoryKind::Device, comm_stream());
    synchronize(backend, comm_stream());
    // The communicator decides what it registers (Communicator::register_buffers): the
    // store says what each buffer serves. Parameters: in-place all-gathers. Gradients:
    // Native reduce-scatters; with F32Accumulate the all-to-all's sends, and where the
    // layout buffer has no parameters also in-place all-gathers (staged, or the warm-up's).
    // The receive buffer: the all-to-all's receives. (A buffer serving both is never
    // registered, nor then its send/recv partners: NCCL 2.28.3 stalled on one, issue 31.)
    if (registered) {  // empty registrations where the backend has none (no NCCL group, or it was aborted)
      std::vector<BufferToRegister> list;
      for (std::size_t i = 0; i < params.size(); ++i) {
        list.push_back({params[i].data(), params[i].bytes(), BufferUse::Collectives});
        const bool gathers = !buffer_has_params(static_cast<int>(i));
        const BufferUse g = !f32_accumulate() ? BufferUse::Collectives : gathers ? BufferUse::Both : BufferUse::SendRecv;
        list.push_back({grads[i].data(), grads[i].bytes(), g});
      }
      list.push_back({pieces.data(), pieces.bytes(), BufferUse::SendRecv});
      registrations = comm.register_buffers(list);
    }
  }

  // NCCL connects lazily: run every bucket's collectives once, eagerly, so that a
  // captured collective is never the first of its kind. The buffers are zero, and a
  // reduce-scatter or all-gather of zeros leaves them zero.
  void warm_up() {
    DeviceGuard guard(device);
    if (comm.size() == 1) return;
    bool grouped_call = false;
    auto both = [&](const Bucket& bk) {
      const std::int64_t per_rank = bk.range.size() / comm.size();
      const auto buf = static_cast<std::size_t>(bk.buffer);
      char* g = grads[buf].as<char>() + static_cast<std::size_t>(bk.range.begin) * size_of(options.grad_dtype);
      // F32Accumulate's buckets never run as one group (they share the receive buffer).
      if (!grouped_call || !f32_accumulate()) reduce_bucket(bk, comm_stream());
      if (buffer_has_params(bk.buffer)) {
        const DType pd = layout.buffers()[buf].dtype;
        char* p = params[buf].as<char>() + static_cast<std::size_t>(bk.range.begin) * size_of(pd);
        comm.all_gather(p, per_rank, pd, comm_stream());
      } else if (staged()) {
        comm.all_gather(g, staged_rank_bytes(static_cast<int>(&bk - layout.buckets().data()), per_rank), DType::e4m3,
                        comm_stream());
      } else {
        comm.all_gather(g, per_rank, options.grad_dtype, comm_stream());
      }
    };
    // Once bucket by bucket (start_*), once as one group (start_*s).
    for (const Bucket& bk : layout.buckets()) both(bk);
    grouped_call = true;
    comm.grouped([&] {
      for (const Bucket& bk : layout.buckets()) both(bk);
    });
    comm.synchronize(comm_stream());  // within the group's wait_timeout, when one is set
  }
};

}  // namespace detail

namespace {
detail::BucketStoreImpl& live(const std::unique_ptr<detail::BucketStoreImpl>& impl) {
  SHARDOPT_REQUIRE(impl != nullptr, ErrorCode::InvalidState, "this BucketStore was moved from; use the one it moved to");
  return *impl;
}
}  // namespace

BucketStore::BucketStore(Communicator comm, Layout layout, BucketStoreOptions options)
    : impl_(std::make_unique<detail::BucketStoreImpl>(std::move(comm), std::move(layout), options)) {}
BucketStore::~BucketStore() = default;
BucketStore::BucketStore(BucketStore&&) noexcept = default;
BucketStore& BucketStore::operator=(BucketStore&&) noexcept = default;

const Layout& BucketStore::layout() const noexcept { return impl_->layout; }
const Communicator& BucketStore::comm() const noexcept { return impl_->comm; }
const BucketStoreOptions& BucketStore::options() const noexcept { return impl_->options; }

void* BucketStore::param_buffer(int buffer) const {
  auto& m = live(impl_);
  m.check_buffer(buffer, "param_buffer");
  return m.params[static_cast<std::size_t>(buffer)].data();
}

void* BucketStore::grad_buffer(int buffer) const {
  auto& m = live(impl_);
  m.check_buffer(buffer, "grad_buffer");
  return m.grads[static_cast<std::size_t>(buffer)].data();
}

void* BucketStore::param_data(int param) const {
  auto& m = live(impl_);
  const ParamPlacement& p = m.param(param, "param_data");
  if (!m.buffer_has_params(p.buffer)) return nullptr;
  const DType dt = m.layout.buffers()[static_cast<std::size_t>(p.buffer)].dtype;
  return m.params[static_cast<std::size_t>(p.buffer)].as<char>() + static_cast<std::size_t>(p.offset) * size_of(dt);
}

void* BucketStore::grad_data(int param) const {
  auto& m = live(impl_);
  const ParamPlacement& p = m.param(param, "grad_data");
  return m.grads[static_cast<std::size_t>(p.buffer)].as<char>() +
         static_cast<std::size_t>(p.offset) * size_of(m.options.grad_dtype);
}

std::size_t BucketStore::param_bytes() const noexcept { return impl_ ? impl_->param_bytes : 0; }
bool BucketStore::has_params(int buffer) const {
  auto& m = live(impl_);
  m.check_buffer(buffer, "has_params");
  return m.buffer_has_params(buffer);
}
std::size_t BucketStore::grad_bytes() const noexcept { return impl_ ? impl_->grad_bytes : 0; }
std::size_t BucketStore::reduce_scratch_bytes() const noexcept { return impl_ ? impl_->scratch_bytes : 0; }
int BucketStore::grad_reduce_chunks(int bucket) const {
  auto& m = live(impl_);
  (void)m.bucket(bucket, "grad_reduce_chunks");
  return m.chunks[static_cast<std::size_t>(bucket)];
}
std::size_t BucketStore::allocator_overhead_bytes() const noexcept { return impl_ ? impl_->overhead_bytes : 0; }

void BucketStore::start_grad_reduce(int bucket, Stream stream) { live(impl_).start(bucket, stream, true); }
void BucketStore::wait_grad_reduce(int bucket, Stream stream) { live(impl_).wait(bucket, stream, true); }
void BucketStore::start_param_gather(int bucket, Stream stream) { live(impl_).start(bucket, stream, false); }
void BucketStore::wait_param_gather(int bucket, Stream stream) { live(impl_).wait(bucket, stream, false); }
void BucketStore::grad_ready(int param, Stream stream) { live(impl_).grad_ready(param, stream); }
void BucketStore::start_grad_reduces(int first, int last, Stream stream) {
  live(impl_).start_range(first, last, stream, true);
}
void BucketStore::start_param_gathers(int first, int last, Stream stream) {
  live(impl_).start_range(first, last, stream, false);
}

bool BucketStore::grad_reduce_pending(int bucket) const {
  auto& m = live(impl_);
  (void)m.bucket(bucket, "grad_reduce_pending");
  return m.grad_pending[static_cast<std::size_t>(bucket)] != 0;
}

void BucketStore::set_gather_planes(int bucket, const std::vector<GatherPlane>& planes) {
  live(impl_).set_gather_planes(bucket, planes);
}

bool BucketStore::has_gather_planes(int bucket) const {
  auto& m = live(impl_);
  (void)m.bucket(bucket, "has_gather_planes");
  return !m.planes[static_cast<std::size_t>(bucket)].empty();
}

bool BucketStore::param_gather_pending(int bucket) const {
  auto& m = live(impl_);
  (void)m.bucket(bucket, "param_gather_pending");
  return m.gather_pending[static_cast<std::size_t>(bucket)] != 0;
}

void BucketStore::all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) {
  live(impl_).all_reduce(data, count, dtype, op, stream);
}

Stream BucketStore::comm_stream() const noexcept { return impl_ ? impl_->comm_stream() : nullptr; }

}  // namespace shardopt
