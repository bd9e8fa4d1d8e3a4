// Fsdp: construction (the units, the layout, the shards and slots), the gradient slot
// and its reduce-scatters, step and zero_grad, checkpoints and the accessors. The
// iteration plan is in fsdp_plan.cpp, the staging in fsdp_staging.cpp; the Impl they
// share in fsdp_impl.hpp.
#include "shardopt/fsdp.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>

#include "comm/comm_impl.hpp"
#include "comm/deadline.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "core/trace.hpp"
#include "core/streams.hpp"
#include "kernels/common/convert.hpp"
#include "kernels/common/piece_sum.hpp"
#include "optimizer/checkpoint.hpp"
#include "optimizer/fsdp_impl.hpp"
#include "optimizer/kernel_preload.hpp"
#include "optimizer/options_agreement.hpp"
#include "optimizer/shard_engine.hpp"
#include "quantized/mxfp8_params.hpp"
#include "quantized/quantized_params.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace {

int shard_size_of(const Communicator& comm, const FsdpOptions& o) {
  const int s = o.shard_group_size == 0 ? comm.size() : o.shard_group_size;
  SHARDOPT_REQUIRE(s >= 1 && comm.size() % s == 0, ErrorCode::InvalidArgument,
                   "shard_group_size " + std::to_string(o.shard_group_size) + " must divide the " +
                       std::to_string(comm.size()) + " ranks (0 = all ranks)");
  return s;
}

// One id per parameter from the units; checks that they partition the parameters.
std::vector<int> unit_ids(const std::vector<FsdpUnit>& units, std::size_t params) {
  SHARDOPT_REQUIRE(!units.empty(), ErrorCode::InvalidArgument, "FSDP needs at least one unit");
  std::vector<int> ids(params, -1);
  for (std::size_t u = 0; u < units.size(); ++u) {
    const FsdpUnit& unit = units[u];
    SHARDOPT_REQUIRE(unit.count >= 1 && unit.first >= 0 && static_cast<std::size_t>(unit.first + unit.count) <= params,
                     ErrorCode::InvalidArgument,
                     "unit '" + unit.name + "' covers parameters [" + std::to_string(unit.first) + ", " +
                         std::to_string(unit.first + unit.count) + "), outside the " + std::to_string(params) +
                         " registered parameters");
    for (int p = unit.first; p < unit.first + unit.count; ++p) {
      SHARDOPT_REQUIRE(ids[static_cast<std::size_t>(p)] < 0, ErrorCode::InvalidArgument,
                       "parameter " + std::to_string(p) + " is in two units ('" +
                           units[static_cast<std::size_t>(ids[static_cast<std::size_t>(p)])].name + "' and '" + unit.name + "')");
      ids[static_cast<std::size_t>(p)] = static_cast<int>(u);
    }
  }
  for (std::size_t p = 0; p < params; ++p)
    SHARDOPT_REQUIRE(ids[p] >= 0, ErrorCode::InvalidArgument,
                     "parameter " + std::to_string(p) + " is in no unit; every parameter needs one");
  return ids;
}

}  // namespace

Fsdp::Impl::Impl(Communicator c, std::vector<ParamSpec> specs, std::vector<FsdpUnit> u, FsdpOptions o)
    : world(std::move(c)),
      opt(std::move(o)),
      backend(world.backend()),
      units(std::move(u)),
      shard_size(shard_size_of(world, opt)),
      shard_comm(shard_size == world.size() ? world : world.split(world.rank() / shard_size, world.rank())),
      replica_comm(shard_size == world.size() ? Communicator::self(backend)
                                              : world.split(world.rank() % shard_size, world.rank())),
      layout(make_layout(std::move(specs))),
      psize(size_of(opt.param_dtype)),
      gsize(size_of(opt.grad_dtype)),
      slot_gsize(size_of(opt.slot_grad_dtype)),
      state(backend, layout, shard_comm.rank(), detail::EngineSettings{opt, opt.grad_dtype, /*shard_addressed=*/true,
                                                             opt.persistent_grad_copies, "FsdpOptions"}),
      gather_stream(backend),
      reduce_stream(backend),
      slot_ready{Event(backend), Event(backend)},
      stage_ready{Event(backend), Event(backend)},
      grad_free(backend),
      gather_go(backend),
      reduce_go(backend) {
  SHARDOPT_REQUIRE(opt.grad_reduce == ReduceOp::Sum || opt.grad_reduce == ReduceOp::Average,
                   ErrorCode::InvalidArgument, "grad_reduce must be Sum or Average");
  SHARDOPT_REQUIRE(is_float_storage(opt.slot_grad_dtype), ErrorCode::InvalidArgument,
                   "slot_grad_dtype must be f32, bf16 or f16");
  // Every rank must agree: the shard group names the first differing parameter; with
  // replicas, the groups must also agree with each other.
  check_layout(shard_comm, layout);
  if (replica_comm.size() > 1) {
    const auto prints = world.all_gather_value(layout.fingerprint());
    for (std::size_t r = 0; r < prints.size(); ++r)
      SHARDOPT_REQUIRE(prints[r] == prints[0], ErrorCode::LayoutMismatch,
                       "rank " + std::to_string(r) + " computed a different FSDP layout than rank 0 (its shard "
                       "group agrees within itself); give every rank the same specs, units and options");
  }
  state.agree_offload(world);  // pinned host memory refused on some rank: every rank throws
  const auto& L = layout;
  const std::size_t nbuf = L.buffers().size();
  quantized = opt.param_format == ParamFormat::Mxfp8 ? detail::quantized_buffers(L) : std::vector<bool>(nbuf, false);
  info.resize(units.size());
  for (auto& ui : info) ui.parts.resize(nbuf);
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    UnitInfo& ui = info[static_cast<std::size_t>(L.bucket_units()[b])];
    const Bucket& bk = L.buckets()[b];
    Part& part = ui.parts[static_cast<std::size_t>(bk.buffer)];
    if (part.begin == part.end) part.begin = bk.range.begin;
    part.end = bk.range.end;
    ui.buckets.push_back(static_cast<int>(b));
  }
  std::int64_t max_native = 0;
  for (auto& ui : info) {
    for (std::size_t b = 0; b < nbuf; ++b) {
      Part& part = ui.parts[b];
      std::int64_t& kind = quantized[b] ? ui.mx : ui.native;
      part.grad_at = ui.numel;
      part.at = kind;
      ui.numel += part.end - part.begin;
      kind += part.end - part.begin;
    }
    max_numel = std::max(max_numel, ui.numel);
    max_native = std::max(max_native, ui.native);
    max_mx = std::max(max_mx, ui.mx);
  }
  param_shards.resize(nbuf);
  grad_shards.resize(nbuf);
  for (std::size_t b = 0; b < nbuf; ++b) {
    const auto shard = static_cast<std::size_t>(L.buffers()[b].shard_numel);
    if (!quantized[b]) param_shards[b] = DeviceBuffer(backend, shard * psize);
    grad_shards[b] = DeviceBuffer(backend, shard * gsize);
    fill_zero_async(backend, param_shards[b].data(), param_shards[b].bytes(), nullptr);
    fill_zero_async(backend, grad_shards[b].data(), grad_shards[b].bytes(), nullptr);
  }
  for (auto& s : param_slots) s = DeviceBuffer(backend, static_cast<std::size_t>(max_native) * psize);
  grad_slot = DeviceBuffer(backend, static_cast<std::size_t>(max_numel) * slot_gsize);
  // MXFP8: the two staging halves of max_mx bytes fit the gradient slot (2 or more
  // bytes per element); the columnwise slot receives the backward planes.
  col_slot = DeviceBuffer(backend, static_cast<std::size_t>(max_mx));
  if (backend == Backend::Host) {
    // The host backend's landing places (see Landing): a gather lands when waited.
    for (auto& l : slot_landing) l.place = DeviceBuffer(backend, static_cast<std::size_t>(max_native) * psize);
    for (auto& l : half_landing) l.place = DeviceBuffer(backend, static_cast<std::size_t>(max_mx));
    for (auto* l : {&slot_landing[0], &slot_landing[1], &half_landing[0], &half_landing[1]})
      fill_zero_async(backend, l->place.data(), l->place.bytes(), nullptr);
  }
  fill_zero_async(backend, grad_slot.data(), grad_slot.bytes(), nullptr);
  allocate_reduce_scratch();
  shardopt::synchronize(backend, nullptr);
  for (std::size_t b = 0; b < nbuf; ++b)
    state.bind(static_cast<int>(b), grad_shards[b].data(), quantized[b] ? nullptr : param_shards[b].data());
  state.check_muon_agreement(shard_comm);  // Muon groups: the same matrices and homes in the shard group
  if (opt.param_format == ParamFormat::Mxfp8) {
    // The sharded quantize of distributed Adam (scheme A), with the data planes kept as
    // this rank's shard; the scale exchange runs on the shard group.
    auto exchange = [this](void* data, std::int64_t count, DType dt, Stream s) {
      std::optional<detail::OperationLabel> label;  // names it if a host-backend wait times out
      if (backend == Backend::Host) label.emplace("MXFP8 scale Max all-reduce");
      shard_comm.all_reduce(data, count, dt, ReduceOp::Max, s);
    };
    mx = std::make_unique<detail::QuantizedParams>(backend, layout, shard_comm.rank(), exchange,
                                                   detail::master_pieces(state, layout), quantized,
                                                   detail::make_mxfp8_format);
  }
}

Layout Fsdp::Impl::make_layout(std::vector<ParamSpec> specs) {
  unit_of_param = unit_ids(units, specs.size());
  SHARDOPT_REQUIRE(is_float_storage(opt.param_dtype), ErrorCode::InvalidArgument,
                   "param_dtype must be f32, bf16 or f16");
  SHARDOPT_REQUIRE(opt.param_format != ParamFormat::Nvfp4, ErrorCode::Unsupported,
                   "FsdpOptions::param_format Nvfp4: NVFP4 parameters exist only in DistributedAdam; use Mxfp8 or "
                   "Native with Fsdp");
  for (auto& s : specs) s.dtype = opt.param_dtype;  // native slots hold one dtype
  LayoutOptions lo;
  lo.bucket_numel = opt.bucket_numel;
  lo.param_units = unit_of_param;
  detail::moment_layout_options(opt, shard_size, lo);
  // MXFP8: the quantized parameters form a buffer of their own (a unit then has a part
  // in each buffer).
  if (opt.param_format == ParamFormat::Mxfp8) lo.param_storage = detail::quantized_storage(specs);
  return Layout(std::move(specs), shard_size, lo);
}

detail::CheckpointTarget Fsdp::Impl::checkpoint_target() {
  detail::CheckpointTarget t;
  t.backend = backend;
  t.layout = &layout;
  t.engine = &state;
  t.all = &world;
  t.shard_rank = shard_comm.rank();
  t.writes_file = world.rank() < shard_size;  // the first replica writes the files
  if (mx_mode())
    t.mxfp8 = [this](int p) -> std::optional<detail::Mxfp8CheckpointSource> {
      const detail::ParamPiece& piece = state.piece(p);
      if (!quantized[static_cast<std::size_t>(piece.buffer)]) return std::nullopt;
      const Mxfp8View v = detail::mxfp8_view(*mx->format(), p);  // whole scales, no data planes
      detail::Mxfp8CheckpointSource src{v.shape, nullptr, nullptr, v.planes.scale_row, v.planes.scale_col};
      if (piece.length > 0) {  // shard planes, indexed like the master shard
        src.row_piece = detail::mxfp8_shard_plane(*mx->format(), piece.buffer, Mxfp8Plane::Rowwise) + piece.shard_offset;
        src.col_piece = detail::mxfp8_shard_plane(*mx->format(), piece.buffer, Mxfp8Plane::Columnwise) + piece.shard_offset;
      }
      return src;
    };
  return t;
}

void Fsdp::Impl::publish_master(Stream stream) {
  state.publish_master(stream);
  if (mx) mx->quantize(0, static_cast<int>(layout.buckets().size()), stream);
}

void Fsdp::Impl::allocate_reduce_scratch() {
  if (opt.grad_reduce_precision != GradReducePrecision::F32Accumulate) return;
  std::int64_t largest = 0;
  for (const Bucket& bk : layout.buckets()) largest = std::max(largest, bk.range.size());
  if (shard_size > 1) reduce_pieces = DeviceBuffer(backend, static_cast<std::size_t>(largest) * slot_gsize);
  if (replica_comm.size() > 1)
    replica_sums = DeviceBuffer(backend, static_cast<std::size_t>(largest / shard_size * replica_comm.size()) *
                                             sizeof(float));
}

void Fsdp::Impl::reduce_f32(char* at, std::int64_t count, void* shard_at, Stream rs) {
  const bool average = opt.grad_reduce == ReduceOp::Average;
  kernels::PieceSum sum;
  sum.pieces = at;  // one shard rank: its slot is the only piece
  sum.piece_dtype = opt.slot_grad_dtype;
  sum.n = shard_size;
  sum.count = count;
  sum.average = average;
  if (shard_size > 1) {
    // The other ranks' pieces arrive in reduce_pieces; this rank's own piece is read where
    // it lies in the slot (no self copy: its slot in reduce_pieces stays unused).
    shard_comm.all_to_all_peers(at, reduce_pieces.data(), count, opt.slot_grad_dtype, rs);
    sum.pieces = reduce_pieces.data();
    const int me = shard_comm.rank();
    sum.own = at + static_cast<std::size_t>(me) * static_cast<std::size_t>(count) * slot_gsize;
    sum.own_index = me;
  }
  if (replica_comm.size() > 1) {
    // The shard hop's fp32 sum into this replica's slice; every replica gathers all of
    // them and sums in replica order, so every replica holds the same bits.
    const int replicas = replica_comm.size();
    sum.out = replica_sums.as<float>() + static_cast<std::size_t>(replica_comm.rank()) * static_cast<std::size_t>(count);
    sum.out_dtype = DType::f32;
    kernels::piece_sum(sum, backend, rs);
    replica_comm.all_gather(replica_sums.data(), count, DType::f32, rs);
    sum.pieces = replica_sums.data();
    sum.piece_dtype = DType::f32;
    sum.n = replicas;
    sum.own = nullptr;  // the replica hop's pieces all lie in replica_sums
    sum.own_index = -1;
  }
  sum.out = shard_at;
  sum.out_dtype = opt.grad_dtype;
  sum.accumulate = true;
  kernels::piece_sum(sum, backend, rs);
}

Fsdp::Impl& Fsdp::impl() const { return static_cast<Impl&>(front()); }

namespace {
// Every parameter Fsdp stores natively (all of them; with Mxfp8 those it does not
// quantize) must say FsdpOptions::param_dtype in its ParamSpec: the option used to win
// without a word (issue 30). Collective: the ranks exchange the index and dtype of their
// first mismatching spec, so that every rank throws: of its own mismatch, or else of the
// first rank's.
void check_spec_dtypes(const Communicator& comm, const std::vector<ParamSpec>& specs, const FsdpOptions& o) {
  const std::vector<int> storage = o.param_format == ParamFormat::Mxfp8 ? detail::quantized_storage(specs)
                                                                        : std::vector<int>(specs.size(), 0);
  std::vector<std::uint64_t> mine = {0, 0};  // 1 + the index of the first mismatch (0: none), its dtype
  for (std::size_t i = 0; i < specs.size() && mine[0] == 0; ++i)
    if (storage[i] != detail::kQuantizedStorage && specs[i].dtype != o.param_dtype)
      mine = {i + 1, static_cast<std::uint64_t>(specs[i].dtype)};
  const std::vector<std::uint64_t> all = comm.all_gather_values(mine);
  for (int k = -1; k < comm.size(); ++k) {
    const int r = k < 0 ? comm.rank() : k;
    const std::uint64_t at = all[2 * static_cast<std::size_t>(r)];
    if (at == 0) continue;
    const std::size_t i = static_cast<std::size_t>(at - 1);
    const std::string have = to_string(static_cast<DType>(all[2 * static_cast<std::size_t>(r) + 1]));
    const std::string want = to_string(o.param_dtype);
    throw Error(ErrorCode::InvalidArgument,
                "Fsdp: ParamSpec '" + (i < specs.size() ? specs[i].name : "#" + std::to_string(i)) + "' (parameter " +
                    std::to_string(i) + (r != comm.rank() ? " on rank " + std::to_string(r) : "") + ") has dtype " +
                    have + " but FsdpOptions::param_dtype is " + want + ", and Fsdp stores every " +
                    (o.param_format == ParamFormat::Mxfp8 ? "parameter it does not quantize" : "parameter") +
                    " in param_dtype: set FsdpOptions::param_dtype = " + have + ", or give the spec dtype " + want);
  }
}

// The checks before the state is made, then the state (the constructor's body).
std::unique_ptr<Fsdp::Impl> make_impl(Communicator comm, std::vector<ParamSpec> specs, std::vector<FsdpUnit> units,
                                      FsdpOptions options) {
  SHARDOPT_REQUIRE(comm.valid(), ErrorCode::InvalidArgument, "Fsdp needs a valid Communicator");
  detail::preload_step_kernels(comm);  // before any collective: optimizer/kernel_preload.hpp
  // The deadlines first (they bound the agreement's own all-gathers, and the shard and
  // replica groups split from `comm` inherit them), then the options, so that a rank
  // whose options differ (or are invalid) fails together with the others.
  if (options.watchdog) comm.set_watchdog(*options.watchdog);
  detail::check_options_agree(comm, "FsdpOptions", detail::fsdp_fields(options));
  detail::validate(options, options.grad_dtype);
  check_spec_dtypes(comm, specs, options);
  return std::make_unique<Fsdp::Impl>(std::move(comm), std::move(specs), std::move(units), std::move(options));
}
}  // namespace

Fsdp::Fsdp(Communicator comm, std::vector<ParamSpec> specs, std::vector<FsdpUnit> units, FsdpOptions options)
    : ShardedOptimizer(make_impl(std::move(comm), std::move(specs), std::move(units), std::move(options)), "Fsdp") {}

Fsdp::~Fsdp() = default;
Fsdp::Fsdp(Fsdp&&) noexcept = default;
Fsdp& Fsdp::operator=(Fsdp&&) noexcept = default;

const FsdpOptions& Fsdp::options() const { return impl().opt; }
int Fsdp::num_units() const { return static_cast<int>(impl().units.size()); }
int Fsdp::shard_rank() const { return impl().shard_comm.rank(); }
int Fsdp::shard_size() const { return impl().shard_size; }
int Fsdp::replicas() const { return impl().world.size() / impl().shard_size; }

int Fsdp::unit_of(int param) const {
  (void)impl().state.piece(param);
  return impl().unit_of_param[static_cast<std::size_t>(param)];
}

bool Fsdp::Impl::stored_mxfp8(int i) const {
  const Impl& m = *this;
  (void)m.state.piece(i);
  return m.mx_mode() && m.quantized[static_cast<std::size_t>(m.layout.params()[static_cast<std::size_t>(i)].buffer)];
}

std::vector<GradView> Fsdp::grad_slot(int unit, Stream stream) {
  Impl& m = impl();
  m.check_unit(unit);
  SHARDOPT_REQUIRE(m.grad_unit < 0, ErrorCode::InvalidState,
                   "grad_slot('" + m.unit_name(unit) + "') while unit '" +
                       (m.grad_unit >= 0 ? m.unit_name(m.grad_unit) : std::string()) +
                       "' holds the gradient slot; call grad_ready for it first");
  for (int h = 0; h < 2; ++h)
    SHARDOPT_REQUIRE(m.staging[static_cast<std::size_t>(h)] != GatherState::InFlight, ErrorCode::InvalidState,
                     "grad_slot('" + m.unit_name(unit) + "') while an MXFP8 plane is still being gathered into the "
                     "gradient slot (a prefetched position); call wait_param for the next unit of the learned order "
                     "first, so that its plane lands before gradients are written there");
  if (m.reduce_pending) m.grad_free.wait(stream);
  // The staging bytes a pass left in the slot are zeroed together with the
  // unit's gradient range, before any gradient is written.
  std::size_t bytes = static_cast<std::size_t>(m.info[static_cast<std::size_t>(unit)].numel) * m.slot_gsize;
  for (int h = 0; h < 2; ++h) {
    if (m.staging[static_cast<std::size_t>(h)] == GatherState::Idle) continue;
    bytes = std::max(bytes, m.staged_end[static_cast<std::size_t>(h)]);
    m.retire_half(h);  // zeroed below
  }
  fill_zero_async(m.backend, m.grad_slot.data(), bytes, stream);
  m.grad_unit = unit;
  return m.unit_views<GradView>(unit, m.grad_slot.data(), m.opt.slot_grad_dtype, true);
}

void Fsdp::grad_ready(int unit, Stream stream) {
  Impl& m = impl();
  SHARDOPT_TRACE_INDEXED("shardopt/reduce_scatter unit", unit);
  m.check_unit(unit);
  if (!m.state.initialized())
    m.state.require_initialized("grad_ready('" + m.unit_name(unit) + "')", Impl::kInitCalls);
  SHARDOPT_REQUIRE(m.grad_unit == unit, ErrorCode::InvalidState,
                   "grad_ready('" + m.unit_name(unit) +
                       "') without grad_slot for it; take the unit's gradient views with grad_slot first");
  const Stream rs = m.reduce_stream.on(stream);
  if (rs != stream) {
    m.reduce_go.record(stream);
    m.reduce_go.wait(rs);
  }
  const Impl::UnitInfo& ui = m.info[static_cast<std::size_t>(unit)];
  const int r = m.shard_comm.rank();
  auto* base = static_cast<char*>(m.grad_slot.data());
  for (int b : ui.buckets) {
    const Bucket& bk = m.layout.buckets()[static_cast<std::size_t>(b)];
    const Impl::Part& part = ui.parts[static_cast<std::size_t>(bk.buffer)];
    const std::int64_t count = bk.range.size() / m.shard_size;
    char* at = base + static_cast<std::size_t>(bk.range.begin - part.begin + part.grad_at) * m.slot_gsize;
    std::optional<detail::OperationLabel> label;  // names the unit if a host-backend wait times out
    if (m.backend == Backend::Host) label.emplace("unit '" + m.unit_name(unit) + "' gradient reduce-scatter");
    char* shard_at = static_cast<char*>(m.grad_shards[static_cast<std::size_t>(bk.buffer)].data()) +
                     static_cast<std::size_t>(bk.shard_offset) * m.gsize;
    if (m.opt.grad_reduce_precision == GradReducePrecision::F32Accumulate) {
      m.reduce_f32(at, count, shard_at, rs);
      continue;
    }
    m.shard_comm.reduce_scatter(at, count, m.opt.slot_grad_dtype, m.opt.grad_reduce, rs);
    char* mine = at + static_cast<std::size_t>(r * count) * m.slot_gsize;
    if (m.replica_comm.size() > 1) m.replica_comm.all_reduce(mine, count, m.opt.slot_grad_dtype, m.opt.grad_reduce, rs);
    kernels::accumulate(mine, m.opt.slot_grad_dtype, shard_at, m.opt.grad_dtype, count, m.backend, rs);
  }
  m.grad_free.record(rs);
  m.reduce_pending = true;
  m.grad_unit = -1;
  if (m.pending_mx != Impl::npos) {
    // The prefetch of the next backward plane, staged in the slot once its
    // reduce-scatter has read it (the gather stream waits for grad_free).
    m.gather_mx(m.pending_mx, stream);
    m.mx_prefetched[m.pending_mx] = 1;
    m.pending_mx = Impl::npos;
  }
}

void Fsdp::Impl::step(Stream stream) {
  SHARDOPT_TRACE("shardopt/step");
  Impl& m = *this;
  m.state.require_initialized("step()", kInitCalls);
  SHARDOPT_REQUIRE(m.grad_unit < 0, ErrorCode::InvalidState,
                   "step() while unit '" + (m.grad_unit >= 0 ? m.unit_name(m.grad_unit) : std::string()) +
                       "' holds the gradient slot; call grad_ready for it first");
  if (m.reduce_pending) {
    m.grad_free.wait(stream);
    m.reduce_pending = false;
  }
  if (!m.learned) {
    m.learned = true;
  } else {
    SHARDOPT_REQUIRE(m.pos == m.order.size(), ErrorCode::InvalidState,
                     "the iteration ended after " + std::to_string(m.pos) + " wait_param calls, but the order learned "
                     "on the first iteration has " + std::to_string(m.order.size()) +
                         "; call wait_param for the same units every iteration");
  }
  m.restart_iteration();
  m.state.step(m.shard_comm, stream);
  // MXFP8: the new master's shard quantized into this rank's shard planes (one scale
  // Max all-reduce); the next iteration's gathers read them.
  if (m.mx) m.mx->quantize(0, static_cast<int>(m.layout.buckets().size()), stream);
}

void Fsdp::Impl::zero_grad(Stream stream) {
  SHARDOPT_TRACE("shardopt/zero_grad");
  Impl& m = *this;
  for (const auto& g : m.grad_shards) fill_zero_async(m.backend, g.data(), g.bytes(), stream);
  m.state.release_copies(stream);
}

void Fsdp::step(Stream stream) { impl().step(stream); }
void Fsdp::zero_grad(Stream stream) { impl().zero_grad(stream); }

ShardView Fsdp::Impl::param_shard(int i) {
  SHARDOPT_REQUIRE(!stored_mxfp8(i), ErrorCode::InvalidArgument,
                   "shard_param('" + layout.specs()[static_cast<std::size_t>(i)].name +
                       "'): an MXFP8 parameter has no parameter shard; write its fp32 master through shard_master(i) "
                       "and publish it with init_from_master");
  return state.param_view(i);
}

ShardView Fsdp::Impl::grad_shard(int i, DType dtype, Stream stream) {
  Impl& m = *this;
  (void)m.state.piece(i);  // the index check, before the name is looked up
  const std::string& name = m.layout.specs()[static_cast<std::size_t>(i)].name;
  return m.state.grad_view(i, dtype, stream, "shard_grad('" + name + "', " + to_string(dtype) + ")");
}

void Fsdp::init_master(Stream stream) {
  SHARDOPT_REQUIRE(!impl().mx_mode(), ErrorCode::InvalidState,
                   "init_master seeds the master from the parameter shards, which MXFP8 parameters do not have; "
                   "write the initial values into shard_master(i) and call init_from_master(stream)");
  impl().state.init_master(stream);
}

void Fsdp::init_from_master(Stream stream) {
  Impl& m = impl();
  SHARDOPT_REQUIRE(m.grad_unit < 0 && m.pos == 0, ErrorCode::InvalidState,
                   "init_from_master in the middle of an iteration; call it before the first wait_param or after "
                   "step()");
  m.publish_master(stream);
}
Stream Fsdp::gather_stream() const { return impl().gather_stream.get(); }

MemoryReport Fsdp::Impl::memory_report() const {
  const Impl& m = *this;
  MemoryReport r;
  for (std::size_t b = 0; b < m.layout.buffers().size(); ++b) {
    r.params += static_cast<std::int64_t>(m.param_shards[b].bytes());
    r.grads += static_cast<std::int64_t>(m.grad_shards[b].bytes());
  }
  r.grads += static_cast<std::int64_t>(m.reduce_pieces.bytes() + m.replica_sums.bytes());
  r.mxfp8 = m.mx ? static_cast<std::int64_t>(m.mx->storage_bytes()) : 0;  // shard planes + whole scales
  r.pool = static_cast<std::int64_t>(m.param_slots[0].bytes() + m.param_slots[1].bytes() + m.grad_slot.bytes() +
                                     m.col_slot.bytes());
  m.state.add_memory(r);  // master, moments, their shard padding, cast copies
  std::vector<std::int64_t> real(m.layout.buffers().size(), 0);
  for (int i = 0; i < static_cast<int>(m.layout.params().size()); ++i) real[static_cast<std::size_t>(m.state.piece(i).buffer)] += m.state.piece(i).length;
  for (std::size_t b = 0; b < real.size(); ++b) {
    const std::size_t param_size = m.quantized[b] ? 2 : m.psize;  // MXFP8: one byte in each shard plane
    r.padding += (m.layout.buffers()[b].shard_numel - real[b]) * static_cast<std::int64_t>(param_size + m.gsize);
  }
  return r;
}

}  // namespace shardopt
