#include "shardopt/fsdp.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>

#include "comm/comm_impl.hpp"
#include "comm/deadline.hpp"
#include "core/check.hpp"
#include "core/live.hpp"
#include "core/memory.hpp"
#include "core/streams.hpp"
#include "kernels/convert.hpp"
#include "optimizer/checkpoint.hpp"
#include "optimizer/options_agreement.hpp"
#include "optimizer/shard_engine.hpp"
#include "optimizer/step_target.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace {
// Named by the errors of the calls that need an initialized master.
constexpr const char* kInitCalls = "init_master(stream) (after writing the shard_param(i) pieces)";
}  // namespace
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

class Fsdp::Impl final : public detail::StepTarget {
 public:
  struct UnitInfo {
    std::vector<int> buckets;  // in buffer order
    std::int64_t begin = 0;    // buffer range of the unit
    std::int64_t end = 0;
  };

  Impl(Communicator c, std::vector<ParamSpec> specs, std::vector<FsdpUnit> u, FsdpOptions o)
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
    const auto& L = layout;
    SHARDOPT_REQUIRE(L.buffers().size() == 1, ErrorCode::Internal, "FSDP expects a single buffer");
    info.resize(units.size());
    for (int b : L.buffers()[0].buckets) {
      UnitInfo& ui = info[static_cast<std::size_t>(L.bucket_units()[static_cast<std::size_t>(b)])];
      const Range r = L.buckets()[static_cast<std::size_t>(b)].range;
      if (ui.buckets.empty()) ui.begin = r.begin;
      ui.buckets.push_back(b);
      ui.end = r.end;
    }
    std::int64_t max_unit = 0;
    for (const auto& ui : info) max_unit = std::max(max_unit, ui.end - ui.begin);
    const std::int64_t shard = L.buffers()[0].shard_numel;
    param_shard = DeviceBuffer(backend, static_cast<std::size_t>(shard) * psize);
    grad_shard = DeviceBuffer(backend, static_cast<std::size_t>(shard) * gsize);
    for (auto& s : param_slots) s = DeviceBuffer(backend, static_cast<std::size_t>(max_unit) * psize);
    grad_slot = DeviceBuffer(backend, static_cast<std::size_t>(max_unit) * slot_gsize);
    fill_zero_async(backend, param_shard.data(), param_shard.bytes(), nullptr);
    fill_zero_async(backend, grad_shard.data(), grad_shard.bytes(), nullptr);
    shardopt::synchronize(backend, nullptr);
    state.bind(0, grad_shard.data(), param_shard.data());
  }

  Layout make_layout(std::vector<ParamSpec> specs) {
    unit_of_param = unit_ids(units, specs.size());
    SHARDOPT_REQUIRE(is_float_storage(opt.param_dtype), ErrorCode::InvalidArgument,
                     "param_dtype must be f32, bf16 or f16");
    for (auto& s : specs) s.dtype = opt.param_dtype;  // one buffer: every slot holds one dtype
    LayoutOptions lo;
    lo.bucket_numel = opt.bucket_numel;
    lo.param_units = unit_of_param;
    return Layout(std::move(specs), shard_size, lo);
  }

  void check_unit(int u) const {
    SHARDOPT_REQUIRE(u >= 0 && u < static_cast<int>(units.size()), ErrorCode::OutOfRange,
                     "unit " + std::to_string(u) + " is out of range [0, " + std::to_string(units.size()) + ")");
  }

  // Enqueues the gather of unit u into slot `slot`, after the work queued on `stream`.
  void gather(int u, int slot, Stream stream) {
    const Stream gs = gather_stream.on(stream);
    if (gs != stream) {
      gather_go.record(stream);
      gather_go.wait(gs);
    }
    const UnitInfo& ui = info[static_cast<std::size_t>(u)];
    const int r = shard_comm.rank();
    auto* base = static_cast<char*>(param_slots[static_cast<std::size_t>(slot)].data());
    for (int b : ui.buckets) {
      const Bucket& bk = layout.buckets()[static_cast<std::size_t>(b)];
      const std::int64_t count = bk.range.size() / shard_size;
      char* at = base + static_cast<std::size_t>(bk.range.begin - ui.begin) * psize;
      copy_async(backend, at + static_cast<std::size_t>(r * count) * psize,
                 static_cast<const char*>(param_shard.data()) + static_cast<std::size_t>(bk.shard_offset) * psize,
                 static_cast<std::size_t>(count) * psize, gs);
      std::optional<detail::OperationLabel> label;  // names the unit if a host-backend wait times out
      if (backend == Backend::Host) label.emplace("unit '" + units[static_cast<std::size_t>(u)].name + "' parameter all-gather");
      shard_comm.all_gather(at, count, opt.param_dtype, gs);
    }
    slot_ready[static_cast<std::size_t>(slot)].record(gs);
  }

  template <class View>
  std::vector<View> unit_views(int u, void* base, DType dtype) const {
    std::vector<View> out;
    const FsdpUnit& unit = units[static_cast<std::size_t>(u)];
    const std::int64_t begin = info[static_cast<std::size_t>(u)].begin;
    for (int p = unit.first; p < unit.first + unit.count; ++p) {
      const auto& pl = layout.params()[static_cast<std::size_t>(p)];
      out.push_back(View{contiguous_view(static_cast<char*>(base) + static_cast<std::size_t>(pl.offset - begin) * size_of(dtype),
                                 layout.specs()[static_cast<std::size_t>(p)].shape, dtype)});
    }
    return out;
  }

  ~Impl() override { detail::orphan_save(last_save); }

  detail::CheckpointTarget checkpoint_target() {
    detail::CheckpointTarget t;
    t.backend = backend;
    t.layout = &layout;
    t.engine = &state;
    t.all = &world;
    t.shard_rank = shard_comm.rank();
    t.writes_file = world.rank() < shard_size;  // the first replica writes the files
    return t;
  }

  // StepGraph's interface: FSDP captures only as one whole iteration (its gathers differ
  // per position in the learned order).
  Backend step_backend() const override { return backend; }
  const Communicator& step_comm() const override { return world; }
  int iteration_microbatches() const override { return opt.microbatches; }
  bool separate_last_microbatch() const override { return true; }
  bool whole_iteration_only() const override { return true; }
  void set_iteration_grad_sync(bool) override {}
  void advance_iteration_microbatch(Stream s) override { state.advance_microbatch(s); }
  void step_and_zero_grad(Stream s) override {
    step(s);
    zero_grad(s);
  }
  void check_step_capturable() const override;
  void finish_pending(Stream) override {}
  void join_reductions(Stream) override {}
  // The bodies of the public calls of the same names.
  void step(Stream stream);
  void zero_grad(Stream stream);

  Communicator world;
  FsdpOptions opt;
  Backend backend;
  std::vector<FsdpUnit> units;
  int shard_size;
  Communicator shard_comm, replica_comm;
  std::vector<int> unit_of_param;
  Layout layout;
  std::size_t psize, gsize, slot_gsize;
  detail::ShardEngine state;
  std::vector<UnitInfo> info;
  DeviceBuffer param_shard, grad_shard, grad_slot;
  std::array<DeviceBuffer, 2> param_slots;
  SideStream gather_stream, reduce_stream;
  std::array<Event, 2> slot_ready;
  Event grad_free;
  Event gather_go, reduce_go;  // the side streams start after the caller's queued work

  // The learned order of wait_param calls and its gather plan.
  bool learned = false;
  std::vector<int> order;
  std::vector<int> slot_of;
  std::vector<char> needs_gather, prefetched;
  std::size_t pos = 0;
  std::shared_ptr<detail::SaveJob> last_save;  // the last save_async (a later save waits for it)
  std::shared_ptr<DeviceBuffer> snapshot_pool;  // save_async's pinned snapshot, kept between saves
  int next_slot = 0;
  int grad_unit = -1;
  bool reduce_pending = false;
};

namespace {
Fsdp::Impl& live(const std::unique_ptr<Fsdp::Impl>& impl) {
  return detail::live(impl, "Fsdp");
}
}  // namespace

detail::StepTarget& Fsdp::step_target() { return live(impl_); }

Fsdp::Fsdp(Communicator comm, std::vector<ParamSpec> specs, std::vector<FsdpUnit> units, FsdpOptions options) {
  SHARDOPT_REQUIRE(comm.valid(), ErrorCode::InvalidArgument, "Fsdp needs a valid Communicator");
  // The deadlines first (they bound the agreement's own all-gathers, and the shard and
  // replica groups split from `comm` inherit them), then the options, so that a rank
  // whose options differ (or are invalid) fails together with the others.
  if (options.watchdog) comm.set_watchdog(*options.watchdog);
  std::vector<detail::OptionField> fields = detail::adam_fields(options);
  fields.insert(fields.end(),
                {{"param_dtype", to_string(options.param_dtype)},
                 {"grad_dtype", to_string(options.grad_dtype)},
                 {"slot_grad_dtype", to_string(options.slot_grad_dtype)},
                 {"grad_reduce", to_string(options.grad_reduce)},
                 {"bucket_numel", options.bucket_numel ? std::to_string(*options.bucket_numel) : "unset"},
                 {"keep_last_unit", detail::option_text(options.keep_last_unit)},
                 {"prefetch", detail::option_text(options.prefetch)},
                 {"shard_group_size", std::to_string(options.shard_group_size)}});
  detail::check_options_agree(comm, "FsdpOptions", fields);
  detail::validate(options, options.grad_dtype);
  impl_ = std::make_unique<Impl>(std::move(comm), std::move(specs), std::move(units), std::move(options));
}

Fsdp::~Fsdp() = default;
Fsdp::Fsdp(Fsdp&&) noexcept = default;
Fsdp& Fsdp::operator=(Fsdp&&) noexcept = default;

const Layout& Fsdp::layout() const { return live(impl_).layout; }
const FsdpOptions& Fsdp::options() const { return live(impl_).opt; }
Backend Fsdp::backend() const { return live(impl_).backend; }
int Fsdp::num_params() const { return static_cast<int>(live(impl_).layout.params().size()); }
int Fsdp::num_units() const { return static_cast<int>(live(impl_).units.size()); }
int Fsdp::shard_rank() const { return live(impl_).shard_comm.rank(); }
int Fsdp::shard_size() const { return live(impl_).shard_size; }
int Fsdp::replicas() const { return live(impl_).world.size() / live(impl_).shard_size; }

int Fsdp::unit_of(int param) const {
  (void)live(impl_).state.piece(param);
  return live(impl_).unit_of_param[static_cast<std::size_t>(param)];
}

std::vector<ParamView> Fsdp::wait_param(int unit, Stream stream) {
  Impl& m = live(impl_);
  m.check_unit(unit);
  if (!m.state.initialized())
    m.state.require_initialized("wait_param('" + m.units[static_cast<std::size_t>(unit)].name + "')", kInitCalls);
  std::size_t k = m.pos;
  if (!m.learned) {
    // First iteration: learn the order and plan a slot per position.
    const bool keep = m.opt.keep_last_unit && !m.order.empty() && m.order.back() == unit;
    m.order.push_back(unit);
    m.needs_gather.push_back(keep ? 0 : 1);
    m.prefetched.push_back(0);
    if (keep) {
      m.slot_of.push_back(m.slot_of.back());
    } else {
      m.slot_of.push_back(m.next_slot);
      m.next_slot ^= 1;
    }
  } else {
    SHARDOPT_REQUIRE(k < m.order.size() && m.order[k] == unit, ErrorCode::InvalidState,
                     "the unit order changed: wait_param #" + std::to_string(k) + " of this iteration asks for unit '" +
                         m.units[static_cast<std::size_t>(unit)].name + "', but the order learned on the first " +
                         "iteration has " +
                         (k < m.order.size() ? "'" + m.units[static_cast<std::size_t>(m.order[k])].name + "'"
                                             : std::string("no more units")) +
                         " there; call wait_param in the same order every iteration");
  }
  ++m.pos;
  const int slot = m.slot_of[k];
  if (m.needs_gather[k]) {
    if (!m.prefetched[k]) m.gather(unit, slot, stream);
    m.prefetched[k] = 0;
    m.slot_ready[static_cast<std::size_t>(slot)].wait(stream);
  }
  if (m.learned && m.opt.prefetch) {
    // Prefetch the next gather of the iteration into the other slot, whose last user
    // is the work queued on `stream` before this call.
    for (std::size_t n = k + 1; n < m.order.size(); ++n) {
      if (!m.needs_gather[n]) continue;
      if (m.prefetched[n]) break;  // already on its way (we are at a kept position)
      m.gather(m.order[n], m.slot_of[n], stream);
      m.prefetched[n] = 1;
      break;
    }
  }
  return m.unit_views<ParamView>(unit, m.param_slots[static_cast<std::size_t>(slot)].data(), m.opt.param_dtype);
}

std::vector<GradView> Fsdp::grad_slot(int unit, Stream stream) {
  Impl& m = live(impl_);
  m.check_unit(unit);
  SHARDOPT_REQUIRE(m.grad_unit < 0, ErrorCode::InvalidState,
                   "grad_slot('" + m.units[static_cast<std::size_t>(unit)].name + "') while unit '" +
                       (m.grad_unit >= 0 ? m.units[static_cast<std::size_t>(m.grad_unit)].name : std::string()) +
                       "' holds the gradient slot; call grad_ready for it first");
  if (m.reduce_pending) m.grad_free.wait(stream);
  const Impl::UnitInfo& ui = m.info[static_cast<std::size_t>(unit)];
  fill_zero_async(m.backend, m.grad_slot.data(), static_cast<std::size_t>(ui.end - ui.begin) * m.slot_gsize, stream);
  m.grad_unit = unit;
  return m.unit_views<GradView>(unit, m.grad_slot.data(), m.opt.slot_grad_dtype);
}

void Fsdp::grad_ready(int unit, Stream stream) {
  Impl& m = live(impl_);
  m.check_unit(unit);
  if (!m.state.initialized())
    m.state.require_initialized("grad_ready('" + m.units[static_cast<std::size_t>(unit)].name + "')", kInitCalls);
  SHARDOPT_REQUIRE(m.grad_unit == unit, ErrorCode::InvalidState,
                   "grad_ready('" + m.units[static_cast<std::size_t>(unit)].name +
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
    const std::int64_t count = bk.range.size() / m.shard_size;
    char* at = base + static_cast<std::size_t>(bk.range.begin - ui.begin) * m.slot_gsize;
    std::optional<detail::OperationLabel> label;  // names the unit if a host-backend wait times out
    if (m.backend == Backend::Host)
      label.emplace("unit '" + m.units[static_cast<std::size_t>(unit)].name + "' gradient reduce-scatter");
    m.shard_comm.reduce_scatter(at, count, m.opt.slot_grad_dtype, m.opt.grad_reduce, rs);
    char* mine = at + static_cast<std::size_t>(r * count) * m.slot_gsize;
    if (m.replica_comm.size() > 1) m.replica_comm.all_reduce(mine, count, m.opt.slot_grad_dtype, m.opt.grad_reduce, rs);
    kernels::accumulate(mine, m.opt.slot_grad_dtype,
                        static_cast<char*>(m.grad_shard.data()) + static_cast<std::size_t>(bk.shard_offset) * m.gsize,
                        m.opt.grad_dtype, count, m.backend, rs);
  }
  m.grad_free.record(rs);
  m.reduce_pending = true;
  m.grad_unit = -1;
}

void Fsdp::Impl::step(Stream stream) {
  Impl& m = *this;
  m.state.require_initialized("step()", kInitCalls);
  SHARDOPT_REQUIRE(m.grad_unit < 0, ErrorCode::InvalidState,
                   "step() while unit '" + (m.grad_unit >= 0 ? m.units[static_cast<std::size_t>(m.grad_unit)].name : "") +
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
  m.pos = 0;
  m.state.step(m.shard_comm, stream);
}

void Fsdp::Impl::zero_grad(Stream stream) {
  Impl& m = *this;
  fill_zero_async(m.backend, m.grad_shard.data(), m.grad_shard.bytes(), stream);
  m.state.release_copies(stream);
}

void Fsdp::step(Stream stream) { live(impl_).step(stream); }
void Fsdp::zero_grad(Stream stream) { live(impl_).zero_grad(stream); }

ShardView Fsdp::shard_param(int i) const { return live(impl_).state.param_view(i); }

ShardView Fsdp::shard_master(int i) const { return live(impl_).state.master_view(i); }
ShardView Fsdp::shard_exp_avg(int i) const { return live(impl_).state.exp_avg_view(i); }
ShardView Fsdp::shard_exp_avg_sq(int i) const { return live(impl_).state.exp_avg_sq_view(i); }

ShardView Fsdp::shard_grad(int i, DType dtype, Stream stream) {
  Impl& m = live(impl_);
  (void)m.state.piece(i);  // the index check, before the name is looked up
  const std::string& name = m.layout.specs()[static_cast<std::size_t>(i)].name;
  return m.state.grad_view(i, dtype, stream, "shard_grad('" + name + "', " + to_string(dtype) + ")");
}

void Fsdp::init_master(Stream stream) { live(impl_).state.init_master(stream); }
void Fsdp::set_lr(float lr) { live(impl_).state.set_lr(lr); }
void Fsdp::set_loss_scale(float scale) { live(impl_).state.set_loss_scale(scale); }
StepScalars* Fsdp::device_scalars() const { return live(impl_).state.scalars(); }
StepScalars Fsdp::read_scalars(Stream stream) const { return live(impl_).state.read_scalars(live(impl_).world, stream); }
void Fsdp::synchronize(Stream stream) const {
  detail::CommAccess::require(live(impl_).world).synchronize(stream, "Fsdp::synchronize");
}
MicrobatchState* Fsdp::device_microbatch() const { return live(impl_).state.microbatch(); }
void Fsdp::advance_microbatch(Stream stream) { live(impl_).state.advance_microbatch(stream); }
Stream Fsdp::gather_stream() const { return live(impl_).gather_stream.get(); }
const std::vector<int>& Fsdp::unit_order() const {
  static const std::vector<int> none;
  return live(impl_).learned ? live(impl_).order : none;
}

MemoryReport Fsdp::memory() const {
  const Impl& m = live(impl_);
  MemoryReport r;
  r.params = static_cast<std::int64_t>(m.param_shard.bytes());
  r.grads = static_cast<std::int64_t>(m.grad_shard.bytes());
  r.pool = static_cast<std::int64_t>(m.param_slots[0].bytes() + m.param_slots[1].bytes() + m.grad_slot.bytes());
  m.state.add_memory(r);  // master, moments, their shard padding, cast copies
  std::int64_t shard_real = 0;
  for (int i = 0; i < num_params(); ++i) shard_real += m.state.piece(i).length;
  r.padding += (m.layout.buffers()[0].shard_numel - shard_real) * static_cast<std::int64_t>(m.psize + m.gsize);
  return r;
}

void Fsdp::Impl::check_step_capturable() const {
  SHARDOPT_REQUIRE(learned, ErrorCode::CaptureRefused,
                   "the unit order is learned on the first iteration, which must run eagerly before capture (StepGraph "
                   "runs it as warm-up: keep StepGraphOptions::warmup_iterations >= 1)");
  state.check_capturable();
}

void Fsdp::save(const std::string& dir, Stream stream, const CheckpointUserData& user) {
  Impl& m = live(impl_);
  detail::wait_save(m.last_save);
  detail::save_checkpoint(m.checkpoint_target(), dir, stream, user);
}

SaveHandle Fsdp::save_async(const std::string& dir, Stream stream, const CheckpointUserData& user) {
  Impl& m = live(impl_);
  detail::wait_save(m.last_save);
  m.last_save = detail::save_checkpoint_async(m.checkpoint_target(), dir, stream, user, m.snapshot_pool);
  return SaveHandle(m.last_save);
}

CheckpointInfo Fsdp::load(const std::string& dir, Stream stream) {
  Impl& m = live(impl_);
  detail::wait_save(m.last_save);
  CheckpointInfo info = detail::load_checkpoint(m.checkpoint_target(), dir, stream);
  m.state.publish_master(stream);  // the parameter shard from the loaded master
  return info;
}

void Fsdp::check_capturable() const { live(impl_).check_step_capturable(); }

}  // namespace shardopt
