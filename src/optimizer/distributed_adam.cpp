#include "shardopt/distributed_adam.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "comm/comm_impl.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "core/trace.hpp"
#include "kernels/common/convert.hpp"
#include "kernels/adam/step_control.hpp"
#include "shardopt/bucket_store.hpp"
#include "quantized/mxfp8_params.hpp"
#include "quantized/nvfp4_params.hpp"
#include "quantized/phase_probe.hpp"
#include "quantized/quantized_params.hpp"
#include "optimizer/grad_zeroing.hpp"
#include "optimizer/checkpoint.hpp"
#include "optimizer/kernel_preload.hpp"
#include "optimizer/options_agreement.hpp"
#include "optimizer/shard_engine.hpp"
#include "optimizer/front_end.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace {
// Named by the errors of the calls that need an initialized master.
constexpr const char* kInitCalls =
    "init_master(stream) (after writing the param views) or init_from_master(stream) (after writing "
    "shard_master(i))";
}  // namespace
namespace {

Layout make_layout(std::vector<ParamSpec> specs, int world, const DistributedAdamOptions& o) {
  LayoutOptions lo;
  lo.bucket_numel = o.bucket_numel;
  detail::moment_layout_options(o, world, lo);
  if (o.param_format != ParamFormat::Native) {
    // Quantized parameters get a storage class of their own, so they never share a
    // buffer with native ones; the 1-D parameters stay native, in f32.
    SHARDOPT_REQUIRE(!o.param_dtype || *o.param_dtype == DType::f32, ErrorCode::InvalidArgument,
                     std::string("param_format ") + to_string(o.param_format) +
                         " keeps the 1-D parameters (norm weights, biases) in f32 and quantizes the others; "
                         "param_dtype " +
                         to_string(*o.param_dtype) + " cannot apply: leave it unset or set f32");
    lo.param_storage = detail::quantized_storage(specs);
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (lo.param_storage[i] != detail::kQuantizedStorage) specs[i].dtype = DType::f32;
    return Layout(std::move(specs), world, lo);
  }
  if (o.param_dtype) {
    SHARDOPT_REQUIRE(is_float_storage(*o.param_dtype), ErrorCode::InvalidArgument,
                     std::string("param_dtype ") + to_string(*o.param_dtype) + " is not one of f32, bf16, f16");
    for (auto& s : specs) s.dtype = *o.param_dtype;
  }
  return Layout(std::move(specs), world, lo);
}

// Which layout buffers hold quantized parameters: those of the quantized storage class.
std::vector<bool> quantized_buffers(const Layout& L, const DistributedAdamOptions& o) {
  if (o.param_format == ParamFormat::Native) return std::vector<bool>(L.buffers().size(), false);
  return detail::quantized_buffers(L);
}

detail::QuantizedParams::MakeFormat format_maker(ParamFormat f) {
  switch (f) {
    case ParamFormat::Mxfp8: return detail::make_mxfp8_format;
    case ParamFormat::Nvfp4: return detail::make_nvfp4_format;
    case ParamFormat::Native: break;
  }
  return nullptr;
}

BucketStoreOptions store_options(const Layout& L, const DistributedAdamOptions& o) {
  BucketStoreOptions so;
  so.grad_dtype = o.grad_dtype;
  so.nccl_registered = o.nccl_registered;
  so.grad_reduce = o.grad_reduce;
  so.grad_reduce_precision = o.grad_reduce_precision;
  const std::vector<bool> q = quantized_buffers(L, o);
  // MXFP8 (issue 29): every rank keeps the whole storage, so each bucket's two data
  // planes are all-gathered in place there (QuantizedParams gives the store the planes,
  // BucketStore::set_gather_planes); nothing goes through the gradient buffer.
  if (o.param_format == ParamFormat::Nvfp4) {
    // Half a byte per element (plus the bytes shared at odd boundaries): any gradient
    // dtype has the room; the store checks each bucket.
    so.staged_gather_rank_bytes = detail::nvfp4_staged_rank_bytes(L, q);
  }
  if (o.param_format != ParamFormat::Native) {
    so.buffer_params.assign(q.size(), true);
    for (std::size_t b = 0; b < q.size(); ++b) so.buffer_params[b] = !q[b];
  }
  return so;
}

BucketStore make_store(const Communicator& comm, std::vector<ParamSpec> specs, const DistributedAdamOptions& o) {
  Layout L = make_layout(std::move(specs), comm.size(), o);
  BucketStoreOptions so = store_options(L, o);
  return BucketStore(comm, std::move(L), std::move(so));
}

}  // namespace

class DistributedAdam::Impl final : public detail::FrontEnd {
 public:
  Impl(Communicator c, std::vector<ParamSpec> specs, DistributedAdamOptions o)
      : comm(std::move(c)),
        opt(std::move(o)),
        backend(comm.backend()),
        store(make_store(comm, std::move(specs), opt)),
        state(backend, store.layout(), comm.rank(), detail::EngineSettings{opt, opt.grad_dtype, /*shard_addressed=*/false,
                                                                 opt.persistent_grad_copies, "DistributedAdamOptions"}),
        mx(backend, store.layout(), store, detail::master_pieces(state, store.layout()), quantized_buffers(store.layout(), opt),
           format_maker(opt.param_format)) {
    state.agree_offload(comm);  // pinned host memory refused on some rank: every rank throws
    for (int b = 0; b < static_cast<int>(store.layout().buffers().size()); ++b)
      state.bind(b, store.grad_buffer(b), store.param_buffer(b));  // null params: MXFP8, master only
    state.check_muon_agreement(comm);  // Muon groups: the same matrices and homes on every rank
    // NVFP4 (issue 29): Adam emits the partial amaxes of the new master, so the step runs
    // no amax pass; elsewhere (a buffer Adam does not wholly write) the pass stays.
    if (opt.param_format == ParamFormat::Nvfp4 && mx.format() != nullptr) {
      adam_amax = true;
      const std::vector<bool> q = quantized_buffers(store.layout(), opt);
      for (std::size_t b = 0; b < q.size(); ++b)
        if (q[b])
          adam_amax = state.emit_amaxes(static_cast<int>(b),
                                        [&](int p) { return detail::nvfp4_adam_amax(*mx.format(), p); }) &&
                      adam_amax;
    }
    // MXFP8 (issue 29): Adam quantizes the owned tile rows while their new masters are in
    // registers (kernels/adam/adam_mxfp8.hpp); those rows leave Adam's chunks.
    if (opt.param_format == ParamFormat::Mxfp8 && mx.format() != nullptr) adam_mx8 = fuse_mxfp8();
    std::vector<bool> landed(store.layout().buckets().size(), false);
    zero_all = detail::grads_outside(store.layout(), size_of(opt.grad_dtype), landed);
    // Only staged buckets (NVFP4) are zeroed by the landing; an MXFP8 bucket gathered in
    // place leaves its gradients to zero_grad, as a native one (issue 29).
    for (std::size_t b = 0; b < landed.size(); ++b)
      landed[b] = mx.is_bucket(static_cast<int>(b)) && !mx.in_place(static_cast<int>(b));
    zero_after_step = detail::grads_outside(store.layout(), size_of(opt.grad_dtype), landed);
  }

  // Per MXFP8 bucket its fused pass; false (nothing changed) when a piece of an MXFP8
  // parameter is not wholly in Adam's chunks.
  bool fuse_mxfp8() {
    const Layout& L = store.layout();
    std::vector<std::vector<kernels::AdamMxfp8Place>> places(L.buckets().size());
    for (std::size_t b = 0; b < L.buckets().size(); ++b) {
      if (!mx.is_bucket(static_cast<int>(b))) continue;
      for (int p : L.buckets()[b].params) {
        const std::optional<kernels::AdamMxfp8Place> at = state.adam_place(p);
        if (!at && state.piece(p).length > 0) return false;
        places[b].push_back(at.value_or(kernels::AdamMxfp8Place{}));
      }
    }
    std::vector<std::vector<ShardChunk>> bands(L.buffers().size());
    for (std::size_t b = 0; b < L.buckets().size(); ++b) {
      if (!mx.is_bucket(static_cast<int>(b))) continue;
      const int buffer = L.buckets()[b].buffer;
      const std::vector<ShardChunk> mine =
          detail::mxfp8_fuse_adam(*mx.format(), static_cast<int>(b), state.adam_config(buffer),
                                  state.adam_pointers(buffer), state.scalars(), places[b]);
      bands[static_cast<std::size_t>(buffer)].insert(bands[static_cast<std::size_t>(buffer)].end(), mine.begin(), mine.end());
    }
    for (std::size_t f = 0; f < bands.size(); ++f) {
      std::sort(bands[f].begin(), bands[f].end(),
                [](const ShardChunk& x, const ShardChunk& y) { return x.shard_offset < y.shard_offset; });
      state.exclude_from_adam(static_cast<int>(f), bands[f]);
    }
    return true;
  }

  int num_buckets() const { return static_cast<int>(store.layout().buckets().size()); }

  // The exchange buffers of the quantized buckets of [first, last) zeroed (one span: they
  // follow one another), before Adam folds the partial amaxes into them.
  void zero_exchange(int first, int last, Stream stream) {
    std::uint8_t *lo = nullptr, *hi = nullptr;
    for (int b = first; b < last; ++b) {
      if (!mx.is_bucket(b)) continue;
      if (lo == nullptr) lo = mx.format()->exchange_begin(b);
      hi = mx.format()->exchange_end(b);
    }
    if (lo != nullptr && hi > lo) fill_zero_async(backend, lo, static_cast<std::size_t>(hi - lo), stream);
  }

  // Native buckets whose deferred all-gather is pending: `stream` waits for them.
  void wait_pending_gathers(Stream stream) {
    for (int b = 0; b < num_buckets(); ++b)
      if (!mx.is_bucket(b) && store.param_gather_pending(b)) store.wait_param_gather(b, stream);
  }

  // Every bucket of [first, last) settled on `stream`: native all-gathers waited for,
  // quantized ones consumed (staged ones landed and their gradient regions zeroed).
  void settle(int first, int last, Stream stream) {
    for (int b = first; b < last; ++b)
      if (!mx.is_bucket(b) && store.param_gather_pending(b)) store.wait_param_gather(b, stream);
    mx.consume(store, first, last, stream);
  }

  // Quantizes the quantized buckets of [first, last) (into the storage, or a staging),
  // then starts the all-gathers of every bucket of the range (after the work queued on
  // `stream`).
  void dispatch(int first, int last, Stream stream, bool partials_done = false) {
    mx.quantize(first, last, stream, partials_done);
    if (opt.grouped_collectives) {
      store.start_param_gathers(first, last, stream);
    } else {
      for (int b = first; b < last; ++b) store.start_param_gather(b, stream);
    }
    mx.dispatched(first, last);
  }

  // Gradients are about to be written or read while a quantized all-gather is still in
  // flight: refuse. A staged one (NVFP4) sits in the gradient buffer (the bytes of the
  // gather and of the gradients would mix); one in place (MXFP8) means the forward read
  // the bucket's weights before they arrived.
  void require_mx_idle(int bucket, const std::string& call) const {
    if (!mx.is_bucket(bucket) || mx.state(bucket) == GatherState::Idle) return;
    const std::string why = mx.in_place(bucket)
                                ? " is still in flight into the storage, so the forward that made these gradients "
                                  "read weights that had not arrived"
                                : " still occupies the bucket's gradient region, so its gradients would mix with the "
                                  "gathered bytes";
    throw Error(ErrorCode::InvalidState,
                call + ": " + mx.name() + " bucket " + std::to_string(bucket) +
                    "'s parameter all-gather (overlap_param_gather)" + why + ". Call wait_param(" +
                    std::to_string(bucket) +
                    ", stream) before the forward reads the bucket's weights (it waits for the gather), or "
                    "zero_grad() before the backward");
  }
  void require_all_mx_idle(const std::string& call) const {
    const int b = mx.first_pending();
    if (b >= 0) require_mx_idle(b, call);
  }

  // Parameter i is stored in `format` (checks i).
  bool stored_as(int i, ParamFormat format) const {
    (void)state.piece(i);
    return opt.param_format == format && mx.is_param(i);
  }

  // A staged quantized gather (NVFP4) overwrites gradient regions: refuse while they hold
  // live gradients. Buckets gathered in place (MXFP8) never touch them.
  void require_no_live_grads(const std::string& call) const {
    if (!mx.any_staged()) return;
    SHARDOPT_REQUIRE(!grads_live, ErrorCode::InvalidState,
                     call + " quantizes the " + mx.name() +
                         " parameters through the gradient buffer, which holds gradients that grad_ready / "
                         "reduce_grads started to reduce; call it after step() or zero_grad()");
  }

  ~Impl() override { detail::orphan_save(last_save); }

  detail::CheckpointTarget checkpoint_target() override {
    detail::CheckpointTarget t;
    t.backend = backend;
    t.layout = &store.layout();
    t.engine = &state;
    t.all = &comm;
    t.shard_rank = comm.rank();
    t.mxfp8 = [this](int p) -> std::optional<detail::Mxfp8CheckpointSource> {
      if (!stored_as(p, ParamFormat::Mxfp8)) return std::nullopt;
      const Mxfp8View v = detail::mxfp8_view(*mx.format(), p);
      const detail::ParamPiece& piece = state.piece(p);
      detail::Mxfp8CheckpointSource src{v.shape, nullptr, nullptr, v.planes.scale_row, v.planes.scale_col};
      if (piece.length > 0) {  // whole planes: this rank's piece starts at its offset in the parameter
        src.row_piece = v.planes.data_row + piece.param_offset;
        src.col_piece = v.planes.data_col + piece.param_offset;
      }
      return src;
    };
    t.nvfp4 = [this](int p) -> std::optional<Nvfp4View> {
      if (!stored_as(p, ParamFormat::Nvfp4)) return std::nullopt;
      return detail::nvfp4_view(*mx.format(), p);
    };
    return t;
  }

  // ShardedOptimizer's interface (optimizer/front_end.hpp).
  detail::ShardEngine& engine() override { return state; }
  const Layout& model_layout() const override { return store.layout(); }
  bool stored_mxfp8(int i) const override { return stored_as(i, ParamFormat::Mxfp8); }
  ShardView param_shard(int i) override;
  ShardView grad_shard(int i, DType dtype, Stream stream) override;
  MemoryReport memory_report() const override;
  void settle_all(Stream stream) override { settle(0, num_buckets(), stream); }
  void require_publishable(const char* call) const override { require_no_live_grads(call); }
  // The parameters from the master: native slices converted and all-gathered, quantized
  // buckets quantized afresh and gathered, every bucket settled.
  void publish_master(Stream stream) override {
    state.publish_master(stream);
    dispatch(0, num_buckets(), stream);
    settle(0, num_buckets(), stream);
  }

  // StepGraph's interface.
  Backend step_backend() const override { return backend; }
  const Communicator& step_comm() const override { return comm; }
  int iteration_microbatches() const override { return opt.microbatches; }
  bool separate_last_microbatch() const override { return opt.microbatches == 1 || opt.overlap_grad_reduce; }
  bool whole_iteration_only() const override { return false; }
  void set_iteration_grad_sync(bool enabled) override { grad_sync = enabled; }
  void advance_iteration_microbatch(Stream s) override { state.advance_microbatch(s); }
  void step_and_zero_grad(Stream s) override;
  // The bodies of the public calls of the same names.
  void reduce_grads(Stream stream);
  void step(Stream stream);
  // after_step: the step just before landed every quantized bucket (nothing ran in
  // between: StepGraph's step_and_zero_grad), so their gradient regions are zero and only
  // the rest is cleared.
  void zero_grad(Stream stream, bool after_step = false);
  void check_step_capturable() const override { state.check_capturable(); }
  void finish_pending(Stream s) override {
    for (int b = 0; b < num_buckets(); ++b) settle(b, b + 1, s);
  }
  void join_reductions(Stream s) override;

  Communicator comm;
  DistributedAdamOptions opt;
  Backend backend;
  BucketStore store;
  detail::ShardEngine state;
  detail::QuantizedParams mx;  // MXFP8 or NVFP4 parameters (none when Native)
  bool grad_sync = true;
  bool adam_amax = false;      // NVFP4: the step's Adam emits the partial amaxes (no amax pass)
  bool adam_mx8 = false;       // MXFP8: the fused pass quantizes the owned tile rows (no owned pass)
  bool grads_reduced = false;  // reduce_grads() ran since the last step / zero_grad
  // What zero_grad clears per buffer: everything, or (right after a step) all but the
  // quantized buckets' regions, which the step's landing zeroed.
  std::vector<std::vector<detail::GradBytes>> zero_all, zero_after_step;
  bool grads_live = false;     // grad_ready / reduce_grads since the last step / zero_grad
};

DistributedAdam::Impl& DistributedAdam::impl() const { return static_cast<Impl&>(front()); }

namespace {
// The checks before the state is made, then the state (the constructor's body).
std::unique_ptr<DistributedAdam::Impl> make_impl(Communicator comm, std::vector<ParamSpec> specs,
                                                 DistributedAdamOptions options) {
  SHARDOPT_REQUIRE(comm.valid(), ErrorCode::InvalidArgument, "DistributedAdam needs a valid Communicator");
  detail::preload_step_kernels(comm);  // before any collective: optimizer/kernel_preload.hpp
  // The deadlines first (they bound the agreement's own all-gathers), then the options,
  // so that a rank whose options differ (or are invalid) fails together with the others.
  if (options.watchdog) comm.set_watchdog(*options.watchdog);
  detail::check_options_agree(comm, "DistributedAdamOptions", detail::distributed_adam_fields(options));
  detail::validate(options, options.grad_dtype);
  SHARDOPT_REQUIRE(options.gather_pipeline >= 1, ErrorCode::InvalidArgument,
                   "gather_pipeline must be >= 1 (1 = no pipelining)");
  return std::make_unique<DistributedAdam::Impl>(std::move(comm), std::move(specs), std::move(options));
}
}  // namespace

DistributedAdam::DistributedAdam(Communicator comm, std::vector<ParamSpec> specs, DistributedAdamOptions options)
    : ShardedOptimizer(make_impl(std::move(comm), std::move(specs), std::move(options)), "DistributedAdam") {}

DistributedAdam::~DistributedAdam() = default;
DistributedAdam::DistributedAdam(DistributedAdam&&) noexcept = default;
DistributedAdam& DistributedAdam::operator=(DistributedAdam&&) noexcept = default;

const Communicator& DistributedAdam::comm() const { return impl().comm; }
const DistributedAdamOptions& DistributedAdam::options() const { return impl().opt; }
int DistributedAdam::param_index(const std::string& name) const { return layout().param_index(name); }

namespace {
std::string param_name(const Layout& L, int i) { return "'" + L.specs()[static_cast<std::size_t>(i)].name + "'"; }
// The call that reads a quantized parameter's storage.
const char* view_call(ParamFormat f) { return f == ParamFormat::Nvfp4 ? "nvfp4_param" : "mxfp8_param"; }
}  // namespace

ParamView DistributedAdam::param(int i) const {
  (void)impl().state.piece(i);
  SHARDOPT_REQUIRE(!impl().mx.is_param(i), ErrorCode::InvalidArgument,
                   "param(" + param_name(layout(), i) + "): an " + impl().mx.name() +
                       " parameter has no bf16 view (param_format " + to_string(impl().opt.param_format) +
                       "); read its storage with " + view_call(impl().opt.param_format) + "(i)");
  const auto& spec = layout().specs()[static_cast<std::size_t>(i)];
  const DType dt = layout().buffers()[static_cast<std::size_t>(layout().params()[static_cast<std::size_t>(i)].buffer)].dtype;
  return ParamView{contiguous_view(impl().store.param_data(i), spec.shape, dt)};
}

GradView DistributedAdam::grad(int i) const {
  (void)impl().state.piece(i);
  const auto& spec = layout().specs()[static_cast<std::size_t>(i)];
  return GradView{contiguous_view(impl().store.grad_data(i), spec.shape, impl().opt.grad_dtype)};
}

namespace {
Shape member_shape_of(const ParamSpec& s) { return s.member_shapes.empty() ? s.shape : s.member_shapes.front(); }

void* member_base(const Layout& L, int i, int m, void* whole, DType dt) {
  const auto& pl = L.params()[static_cast<std::size_t>(i)];
  SHARDOPT_REQUIRE(m >= 0 && m < pl.members, ErrorCode::OutOfRange,
                   "member " + std::to_string(m) + " of '" + L.specs()[static_cast<std::size_t>(i)].name +
                       "' is out of range [0, " + std::to_string(pl.members) + ")");
  return static_cast<char*>(whole) + static_cast<std::size_t>(m * pl.member_numel) * size_of(dt);
}
}  // namespace

ParamView DistributedAdam::member_param(int i, int m) const {
  const ParamView whole = param(i);
  return ParamView{contiguous_view(member_base(layout(), i, m, whole.data, whole.dtype),
                             member_shape_of(layout().specs()[static_cast<std::size_t>(i)]), whole.dtype)};
}

GradView DistributedAdam::member_grad(int i, int m) const {
  const GradView whole = grad(i);
  return GradView{contiguous_view(member_base(layout(), i, m, whole.data, whole.dtype),
                            member_shape_of(layout().specs()[static_cast<std::size_t>(i)]), whole.dtype)};
}

ShardView DistributedAdam::Impl::param_shard(int i) {
  Impl& m = *this;
  (void)m.state.piece(i);
  SHARDOPT_REQUIRE(!m.mx.is_param(i), ErrorCode::InvalidArgument,
                   "shard_param(" + param_name(m.store.layout(), i) + "): an " + m.mx.name() +
                       " parameter has no param buffer; write its fp32 master through shard_master(i) and "
                       "publish it with init_from_master or gather_params");
  return m.state.param_view(i);
}

bool DistributedAdam::is_nvfp4(int i) const { return impl().stored_as(i, ParamFormat::Nvfp4); }

namespace {
// Error(InvalidArgument) unless parameter i is stored in `want`, saying why and what to
// call instead (the check of mxfp8_param / nvfp4_param).
void require_view(const DistributedAdam::Impl& m, int i, ParamFormat want) {
  if (m.stored_as(i, want)) return;
  const ParamFormat has = m.opt.param_format;
  const bool quantized = has != ParamFormat::Native && m.mx.is_param(i);
  throw Error(ErrorCode::InvalidArgument,
              std::string(view_call(want)) + "(" + param_name(m.store.layout(), i) + "): not an " +
                  (want == ParamFormat::Nvfp4 ? "NVFP4" : "MXFP8") + " parameter (" +
                  (has != want ? std::string("param_format is ") + to_string(has)
                               : std::string("1-D parameters stay native in f32")) +
                  "); use " + (quantized ? std::string(view_call(has)) + "(i)" : std::string("param(i)")));
}
}  // namespace

Mxfp8View DistributedAdam::mxfp8_param(int i) const {
  require_view(impl(), i, ParamFormat::Mxfp8);
  return detail::mxfp8_view(*impl().mx.format(), i);
}

Nvfp4View DistributedAdam::nvfp4_param(int i) const {
  require_view(impl(), i, ParamFormat::Nvfp4);
  return detail::nvfp4_view(*impl().mx.format(), i);
}

ShardView DistributedAdam::Impl::grad_shard(int i, DType dtype, Stream stream) {
  return state.grad_view(i, dtype, stream, "shard_grad(" + param_name(store.layout(), i) + ", " + to_string(dtype) + ")");
}

void DistributedAdam::init_master(Stream stream) {
  SHARDOPT_REQUIRE(!impl().mx.any(), ErrorCode::InvalidState,
                   std::string("init_master seeds the master from the param views, which ") + impl().mx.name() +
                       " parameters do not have; write "
                   "the initial values into shard_master(i) and call init_from_master(stream)");
  impl().wait_pending_gathers(stream);
  impl().state.init_master(stream);
  const int nb = static_cast<int>(layout().buckets().size());
  for (int b = 0; b < nb; ++b) impl().store.start_param_gather(b, stream);
  for (int b = 0; b < nb; ++b) impl().store.wait_param_gather(b, stream);
}

void DistributedAdam::init_from_master(Stream stream) {
  Impl& m = impl();
  const int nb = m.num_buckets();
  m.settle(0, nb, stream);
  m.require_no_live_grads("init_from_master");
  m.publish_master(stream);
}

void DistributedAdam::grad_ready(int i, Stream stream) {
  (void)impl().state.piece(i);
  if (!impl().state.initialized())
    impl().state.require_initialized("grad_ready(" + param_name(layout(), i) + ")", kInitCalls);
  impl().require_mx_idle(layout().params()[static_cast<std::size_t>(i)].bucket,
                         "grad_ready(" + param_name(layout(), i) + ")");
  if (!impl().grad_sync || !impl().opt.overlap_grad_reduce) return;
  impl().grads_live = true;
  impl().store.grad_ready(i, stream);
}

void DistributedAdam::set_grad_sync(bool enabled) { impl().grad_sync = enabled; }
bool DistributedAdam::grad_sync() const { return impl().grad_sync; }

void DistributedAdam::Impl::reduce_grads(Stream stream) {
  state.require_initialized("reduce_grads()", kInitCalls);
  require_all_mx_idle("reduce_grads");
  grads_live = true;
  const int nb = static_cast<int>(store.layout().buckets().size());
  if (opt.grouped_collectives) {
    store.start_grad_reduces(0, nb, stream);  // the buckets grad_ready did not start
  } else {
    for (int b = 0; b < nb; ++b)
      if (!store.grad_reduce_pending(b)) store.start_grad_reduce(b, stream);
  }
  for (int b = 0; b < nb; ++b) store.wait_grad_reduce(b, stream);
  grads_reduced = true;
}

void DistributedAdam::Impl::step(Stream stream) {
  SHARDOPT_TRACE("shardopt/step");
  Impl& m = *this;
  m.state.require_initialized("step()", kInitCalls);
  // A quantized gather still in flight means the gradients were written over it (or the
  // forward read weights before they arrived: no wait_param / zero_grad since the last
  // step): refuse.
  m.require_all_mx_idle("step");
  if (!m.grads_reduced) m.reduce_grads(stream);
  m.grads_reduced = false;
  // Adam writes the param slices: gathers of the previous step must be done with them.
  m.wait_pending_gathers(stream);
  m.state.begin_step(m.comm, stream);
  // Adam per group of buckets; each group's all-gather overlaps the next group's Adam.
  // MXFP8 buckets: Adam updates the master only, then the group is quantized into this
  // rank's slice of its gather planes (scheme A) and all-gathered there, in place in the
  // storage (NVFP4: into its gradient regions, staged). A step that found an Inf leaves
  // the master as it was, so it requantizes the same bytes.
  const int nb = m.num_buckets();
  const int groups = std::max(1, std::min(m.opt.gather_pipeline, nb));
  for (int g = 0; g < groups; ++g) {
    const int first = static_cast<int>(static_cast<std::int64_t>(nb) * g / groups);
    const int last = static_cast<int>(static_cast<std::int64_t>(nb) * (g + 1) / groups);
    if (m.adam_amax) m.zero_exchange(first, last, stream);
    for (int b = first; b < last; ++b) {
      const auto [c0, c1] = m.state.bucket_chunks(b);
      m.state.apply(store.layout().buckets()[static_cast<std::size_t>(b)].buffer, c0, c1, stream);
    }
    if (m.adam_mx8) {
      detail::phase_mark("quantize", stream);
      for (int b = first; b < last; ++b)
        if (m.mx.is_bucket(b)) detail::mxfp8_adam_pass(*m.mx.format(), b, stream);
    }
    m.dispatch(first, last, stream, m.adam_amax || m.adam_mx8);
  }
  m.state.end_step(stream);  // offloaded state: its streams join back
  m.grads_live = false;  // consumed by Adam; staged (NVFP4) regions now hold the staging
  const bool defer = m.opt.overlap_param_gather && !is_capturing(m.backend, stream);
  if (!defer) m.settle(0, nb, stream);
}

void DistributedAdam::gather_params(Stream stream) {
  Impl& m = impl();
  m.state.require_initialized("gather_params()", kInitCalls);
  const bool defer = m.opt.overlap_param_gather && !is_capturing(m.backend, stream);
  const int nb = m.num_buckets();
  m.settle(0, nb, stream);
  m.require_no_live_grads("gather_params");
  m.dispatch(0, nb, stream);
  if (!defer) {
    m.settle(0, nb, stream);
  } else {
    m.mx.consume(m.store, 0, nb, stream);  // quantized buckets are always consumed (forced gather)
  }
}

void DistributedAdam::wait_param(int bucket, Stream stream) {
  SHARDOPT_REQUIRE(bucket >= 0 && bucket < static_cast<int>(layout().buckets().size()), ErrorCode::OutOfRange,
                   "bucket " + std::to_string(bucket) + " is out of range [0, " +
                       std::to_string(layout().buckets().size()) + ")");
  impl().settle(bucket, bucket + 1, stream);
}

GatherState DistributedAdam::gather_state(int bucket) const {
  SHARDOPT_REQUIRE(bucket >= 0 && bucket < static_cast<int>(layout().buckets().size()), ErrorCode::OutOfRange,
                   "gather_state: bucket " + std::to_string(bucket) + " is out of range [0, " +
                       std::to_string(layout().buckets().size()) + ")");
  if (impl().mx.is_bucket(bucket)) return impl().mx.state(bucket);
  return impl().store.param_gather_pending(bucket) ? GatherState::InFlight : GatherState::Idle;
}

void DistributedAdam::Impl::zero_grad(Stream stream, bool after_step) {
  SHARDOPT_TRACE("shardopt/zero_grad");
  Impl& m = *this;
  // Pending staged gathers sit in the gradient buffer: land them first, then zero (seed
  // 001's bug was a zeroing that ran before the gather had landed); in-place ones are
  // waited for.
  m.mx.consume(m.store, 0, m.num_buckets(), stream);
  m.grads_reduced = false;
  m.grads_live = false;
  // Right behind a step every staged bucket (NVFP4) was dispatched and is now consumed,
  // so its region was zeroed on `stream` and nothing wrote it since: skip it. MXFP8
  // buckets, gathered in place, are zeroed here like native ones (issue 29).
  const std::vector<std::vector<detail::GradBytes>>& ranges = after_step ? m.zero_after_step : m.zero_all;
  for (std::size_t b = 0; b < ranges.size(); ++b) {
    auto* base = static_cast<std::uint8_t*>(m.store.grad_buffer(static_cast<int>(b)));
    for (const detail::GradBytes& r : ranges[b]) {
      fill_zero_async(m.backend, base + r.begin, r.end - r.begin, stream);
      detail::count_zero_grad_bytes(r.end - r.begin);
    }
  }
  m.state.release_copies(stream);
}

MemoryReport DistributedAdam::Impl::memory_report() const {
  const Impl& m = *this;
  const Layout& L = store.layout();
  MemoryReport r;
  r.params = static_cast<std::int64_t>(m.store.param_bytes());
  r.grads = static_cast<std::int64_t>(m.store.grad_bytes() + m.store.reduce_scratch_bytes());
  (m.opt.param_format == ParamFormat::Nvfp4 ? r.nvfp4 : r.mxfp8) = static_cast<std::int64_t>(m.mx.storage_bytes());
  r.nccl_overhead = static_cast<std::int64_t>(m.store.allocator_overhead_bytes());
  m.state.add_memory(r);  // master, moments, their shard padding, cast copies
  for (std::size_t b = 0; b < L.buffers().size(); ++b) {
    const BufferLayout& buf = L.buffers()[b];
    std::int64_t real = 0;
    for (int p : buf.params) real += L.params()[static_cast<std::size_t>(p)].numel;
    const std::size_t param_size = m.store.has_params(static_cast<int>(b)) ? size_of(buf.dtype) : 0;
    r.padding += (buf.numel - real) * static_cast<std::int64_t>(param_size + size_of(m.opt.grad_dtype));
  }
  return r;
}

void DistributedAdam::Impl::step_and_zero_grad(Stream s) {
  step(s);
  zero_grad(s, /*after_step=*/true);
}

void DistributedAdam::Impl::join_reductions(Stream s) { reduce_grads(s); }

void DistributedAdam::reduce_grads(Stream stream) { impl().reduce_grads(stream); }
void DistributedAdam::step(Stream stream) { impl().step(stream); }
void DistributedAdam::zero_grad(Stream stream) { impl().zero_grad(stream); }

}  // namespace shardopt
