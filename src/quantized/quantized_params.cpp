#include "quantized/quantized_params.hpp"

#include <atomic>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "core/trace.hpp"
#include "quantized/phase_probe.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {
namespace {
std::atomic<std::int64_t> landed_total{0};  // landed_bytes()
}  // namespace

std::int64_t landed_bytes() { return landed_total.load(std::memory_order_relaxed); }

const char* gather_state_name(GatherState s) {
  switch (s) {
    case GatherState::Idle: return "Idle";
    case GatherState::InFlight: return "InFlight";
    case GatherState::Landed: return "Landed";
    case GatherState::Consumed: return "Consumed";
  }
  return "?";
}

bool gather_transition_legal(GatherState s, GatherState to) {
  return (s == GatherState::Idle && to == GatherState::InFlight) ||
         (s == GatherState::InFlight && to == GatherState::Landed) ||
         (s == GatherState::Landed && to == GatherState::Consumed) ||
         (s == GatherState::Consumed && to == GatherState::Idle);
}

void throw_illegal_transition(const std::string& what, GatherState from, GatherState to) {
  throw Error(ErrorCode::Internal,
              what + ": illegal gather transition " + gather_state_name(from) + " -> " + gather_state_name(to));
}

void throw_internal(const std::string& message) { throw Error(ErrorCode::Internal, message); }

void StoredFormat::allocate(std::size_t bytes) {
  storage_ = DeviceBuffer(backend_, bytes);
  fill_zero_async(backend_, storage_.data(), storage_.bytes(), nullptr);
}

bool is_quantized_spec(const ParamSpec& spec) {
  const std::size_t lead = spec.members() > 1 ? 1 : 0;
  return spec.shape.size() >= lead + 2;
}

std::vector<int> quantized_storage(const std::vector<ParamSpec>& specs) {
  std::vector<int> out(specs.size(), 0);
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (is_quantized_spec(validated(specs[i]))) out[i] = kQuantizedStorage;
  return out;
}

std::vector<bool> quantized_buffers(const Layout& layout) {
  std::vector<bool> q(layout.buffers().size(), false);
  for (std::size_t b = 0; b < q.size(); ++b) q[b] = layout.buffers()[b].storage == kQuantizedStorage;
  return q;
}

std::int64_t staged_rank_bytes(const BucketStoreOptions& options, const Layout& layout, int bucket) {
  if (!options.staged_gather_rank_bytes.empty()) return options.staged_gather_rank_bytes[static_cast<std::size_t>(bucket)];
  return layout.buckets()[static_cast<std::size_t>(bucket)].range.size() / layout.world_size() *
         options.staged_gather_bytes;
}

// Marks the quantized parameters and buckets; false when there are none.
bool QuantizedParams::mark(const std::vector<bool>& quantized) {
  const Layout& L = layout_;
  param_.assign(L.params().size(), false);
  bucket_.resize(L.buckets().size());
  staging_.resize(L.buckets().size());
  bool any = false;
  for (std::size_t p = 0; p < L.params().size(); ++p)
    if (quantized[static_cast<std::size_t>(L.params()[p].buffer)]) param_[p] = any = true;
  for (std::size_t b = 0; b < L.buckets().size(); ++b)
    bucket_[b].quantized = quantized[static_cast<std::size_t>(L.buckets()[b].buffer)];
  return any;
}

// Builds the format over the staging set so far, then the landing table (empty for
// shard storage) and warms the exchange up.
void QuantizedParams::make_format(int rank, const std::vector<MasterPiece>& masters,
                                  const std::vector<bool>& quantized, MakeFormat make, bool shard_storage,
                                  MemoryKind gather_memory) {
  const Layout& L = layout_;
  SHARDOPT_REQUIRE(make != nullptr, ErrorCode::Internal, "quantized parameters without a format");
  FormatContext ctx;
  ctx.backend = backend_;
  ctx.layout = &L;
  ctx.rank = rank;
  ctx.masters = &masters;
  ctx.buffers = &quantized;
  ctx.staging = &staging_;
  ctx.shard_storage = shard_storage;
  ctx.direct = !shard_storage && L.world_size() == 1;
  ctx.gather_memory = gather_memory;
  format_ = make(ctx);

  // The landings in bucket order (a run of buckets is one sub-table).
  std::vector<kernels::BytePiece> table;
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    BucketInfo& bi = bucket_[b];
    if (!bi.quantized) continue;
    Landing& l = bi.landing;
    l.begin = static_cast<std::int64_t>(table.size());
    format_->landing(static_cast<int>(b), table);
    l.end = static_cast<std::int64_t>(table.size());
    for (std::int64_t k = l.begin; k < l.end; ++k) l.bytes += table[static_cast<std::size_t>(k)].bytes;
  }
  pieces_ = DeviceBuffer(backend_, table.size() * sizeof(kernels::BytePiece));
  copy_async(backend_, pieces_.data(), table.data(), pieces_.bytes(), nullptr);
  synchronize(backend_, nullptr);
  warm_up();
}

QuantizedParams::QuantizedParams(Backend backend, const Layout& L, BucketStore& store,
                                 const std::vector<MasterPiece>& masters, const std::vector<bool>& quantized,
                                 MakeFormat make)
    : backend_(backend), layout_(L), exchange_fn_(store_exchange(store)), store_(&store) {
  if (!mark(quantized)) return;
  const std::size_t gsize = size_of(store.options().grad_dtype);
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    if (!bucket_[b].quantized) continue;
    const Bucket& bk = L.buckets()[b];
    Staging& st = staging_[b];
    st.region = static_cast<std::uint8_t*>(store.grad_buffer(bk.buffer)) + static_cast<std::size_t>(bk.range.begin) * gsize;
    st.region_bytes = static_cast<std::size_t>(bk.range.size()) * gsize;
    st.rank_bytes = staged_rank_bytes(store.options(), L, static_cast<int>(b));
    SHARDOPT_REQUIRE(st.rank_bytes * L.world_size() <= static_cast<std::int64_t>(st.region_bytes), ErrorCode::Internal,
                     "quantized bucket " + std::to_string(b) + ": its staging does not fit its gradient region");
  }
  // Memory that in-place gathers target is allocated and registered as the store's own.
  const bool registered = backend == Backend::Cuda && store.options().nccl_registered && nccl_compiled();
  make_format(store.comm().rank(), masters, quantized, make, /*shard_storage=*/false,
              registered ? MemoryKind::NcclDevice : MemoryKind::Device);
  gather_in_place(store, registered);
}

// The buckets whose format gives gather planes get them in the store (collective: every
// rank builds the same format); their memory is registered first, so that the warm-up
// gathers already take the registered path.
void QuantizedParams::gather_in_place(BucketStore& store, bool registered) {
  std::vector<std::vector<GatherPlane>> planes(bucket_.size());
  bool any = false;
  for (std::size_t b = 0; b < bucket_.size(); ++b) {
    if (!bucket_[b].quantized) continue;
    planes[b] = format_->gather_planes(static_cast<int>(b));
    any = any || !planes[b].empty();
  }
  if (!any) return;
  const BufferToRegister memory = format_->gather_memory();
  if (registered && memory.bytes > 0) registrations_ = store.comm().register_buffers({memory});
  for (std::size_t b = 0; b < bucket_.size(); ++b) {
    if (planes[b].empty()) continue;
    store.set_gather_planes(static_cast<int>(b), planes[b]);
    bucket_[b].in_place = true;
  }
}

bool QuantizedParams::any_staged() const {
  for (const BucketInfo& bi : bucket_)
    if (bi.quantized && !bi.in_place) return true;
  return false;
}

QuantizedParams::~QuantizedParams() {
  bool in_place = false;
  for (const BucketInfo& bi : bucket_) in_place = in_place || bi.in_place;
  if (!in_place || store_ == nullptr || backend_ != Backend::Cuda) return;
  try {  // a gather of a deferred step may still write the storage
    synchronize(backend_, store_->comm_stream());
  } catch (...) {  // a destructor does not throw
  }
}

QuantizedParams::QuantizedParams(Backend backend, const Layout& L, int rank, ExchangeFn exchange,
                                 const std::vector<MasterPiece>& masters, const std::vector<bool>& quantized,
                                 MakeFormat make)
    : backend_(backend), layout_(L), exchange_fn_(std::move(exchange)) {
  if (!mark(quantized)) return;
  make_format(rank, masters, quantized, make, /*shard_storage=*/true);
}

// NCCL connects lazily, per algorithm: run the exchange all-reduce eagerly once per
// bucket span and once over all of them (the buffers are zero, and stay zero), so that a
// captured step's all-reduce is never the first of its kind. Collective (every rank
// constructs).
void QuantizedParams::warm_up() {
  if (backend_ != Backend::Cuda || layout_.world_size() == 1) return;
  std::uint8_t *lo = nullptr, *hi = nullptr;
  for (std::size_t b = 0; b < bucket_.size(); ++b) {
    if (!bucket_[b].quantized) continue;
    std::uint8_t* begin = format_->exchange_begin(static_cast<int>(b));
    std::uint8_t* end = format_->exchange_end(static_cast<int>(b));
    exchange(begin, end, nullptr);
    if (lo == nullptr) lo = begin;
    hi = end;
  }
  exchange(lo, hi, nullptr);
  synchronize(backend_, nullptr);
}

int QuantizedParams::first_pending() const {
  for (std::size_t b = 0; b < bucket_.size(); ++b)
    if (bucket_[b].quantized && bucket_[b].state != GatherState::Idle) return static_cast<int>(b);
  return -1;
}

void QuantizedParams::advance(int bucket, GatherState to) {
  advance_gather(bucket_[static_cast<std::size_t>(bucket)].state, to,
                 [&] { return std::string(name()) + " bucket " + std::to_string(bucket); });
}

QuantizedParams::ExchangeFn store_exchange(BucketStore& store) {
  // Through the store, behind the all-gathers already started on its communication
  // stream: every collective of the step runs in one order, and `stream` waits only for
  // this one.
  return [&store](void* data, std::int64_t count, DType dt, Stream stream) {
    store.all_reduce(data, count, dt, ReduceOp::Max, stream);
  };
}

void QuantizedParams::exchange(std::uint8_t* begin, std::uint8_t* end, Stream stream) {
  if (end <= begin || layout_.world_size() == 1) return;
  const DType dt = format_->exchange_dtype();
  exchange_fn_(begin, static_cast<std::int64_t>(static_cast<std::size_t>(end - begin) / size_of(dt)), dt, stream);
}

void QuantizedParams::quantize(int first, int last, Stream stream, bool partials_done) {
  std::uint8_t *span_begin = nullptr, *span_end = nullptr;
  for (int b = first; b < last; ++b) {
    BucketInfo& bi = bucket_[static_cast<std::size_t>(b)];
    if (!bi.quantized) continue;
    SHARDOPT_REQUIRE(bi.state == GatherState::Idle, ErrorCode::Internal,
                     std::string(name()) + " bucket " + std::to_string(b) + " is quantized while its gather is " +
                         gather_state_name(bi.state));
    if (!partials_done) {
      phase_mark(format_->partials_mark(), stream);
      SHARDOPT_TRACE_INDEXED("shardopt/amax bucket", b);
      format_->partials(b, stream);
    }
    if (span_begin == nullptr) span_begin = format_->exchange_begin(b);
    span_end = format_->exchange_end(b);
  }
  if (span_begin == nullptr) return;
  SHARDOPT_TRACE("shardopt/quantize");
  phase_mark("exchange", stream);
  exchange(span_begin, span_end, stream);
  phase_mark(format_->quantize_mark(), stream);
  for (int b = first; b < last; ++b)
    if (bucket_[static_cast<std::size_t>(b)].quantized) format_->quantize(b, stream);
  phase_mark("after quantize", stream);
}

void QuantizedParams::dispatched(int first, int last) {
  for (int b = first; b < last; ++b)
    if (bucket_[static_cast<std::size_t>(b)].quantized) advance(b, GatherState::InFlight);
}

// `stream` waits for bucket b's all-gather if it is in flight (InFlight -> Landed).
void QuantizedParams::wait_gather(BucketStore& store, int b, Stream stream) {
  if (bucket_[static_cast<std::size_t>(b)].state != GatherState::InFlight) return;
  phase_mark("gather wait", stream);
  store.wait_param_gather(b, stream);
  advance(b, GatherState::Landed);
}

void QuantizedParams::consume(BucketStore& store, int first, int last, Stream stream) {
  auto pending = [&](int b) {
    const BucketInfo& bi = bucket_[static_cast<std::size_t>(b)];
    return bi.quantized && (bi.state == GatherState::InFlight || bi.state == GatherState::Landed);
  };
  auto region = [&](int b) -> const Staging& { return staging_[static_cast<std::size_t>(b)]; };
  int b = first;
  while (b < last) {
    if (!pending(b)) {
      ++b;
      continue;
    }
    if (bucket_[static_cast<std::size_t>(b)].in_place) {  // gathered into the storage: only waited for
      wait_gather(store, b, stream);
      advance(b, GatherState::Consumed);
      advance(b, GatherState::Idle);
      ++b;
      continue;
    }
    SHARDOPT_TRACE_INDEXED("shardopt/landing bucket", b);
    // A run of pending staged buckets whose gradient regions are adjacent: one copy
    // launch and one memset for all of them.
    int e = b;
    while (e < last && pending(e) && !bucket_[static_cast<std::size_t>(e)].in_place &&
           (e == b || region(e).region == region(e - 1).region + region(e - 1).region_bytes)) {
      wait_gather(store, e, stream);
      ++e;
    }
    auto landing = [&](int k) -> const Landing& { return bucket_[static_cast<std::size_t>(k)].landing; };
    const std::int64_t copies = landing(e - 1).end - landing(b).begin;  // none where phase 2 wrote the storage
    if (copies > 0) phase_mark("landing", stream);
    kernels::copy_pieces(pieces_.as<kernels::BytePiece>() + landing(b).begin, copies, backend_, stream);
    for (int k = b; k < e; ++k) landed_total.fetch_add(landing(k).bytes, std::memory_order_relaxed);
    // The staging bytes (and whatever else the region held) must not meet the next
    // backward: the region is zero from here on (staging in a gradient region must be
    // zeroed on every path before the next backward, train -> eval -> train included).
    phase_mark("zeroing", stream);
    fill_zero_async(backend_, region(b).region,
                    static_cast<std::size_t>(region(e - 1).region + region(e - 1).region_bytes - region(b).region),
                    stream);
    phase_mark("after zeroing", stream);
    for (int k = b; k < e; ++k) {
      advance(k, GatherState::Consumed);
      advance(k, GatherState::Idle);
    }
    b = e;
  }
}

}  // namespace shardopt::detail
