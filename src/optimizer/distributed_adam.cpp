#include "shardopt/distributed_adam.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "kernels/convert.hpp"
#include "kernels/step_control.hpp"
#include "shardopt/bucket_store.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace {

Layout make_layout(std::vector<ParamSpec> specs, int world, const DistributedAdamOptions& o) {
  if (o.param_dtype) {
    SHARDOPT_REQUIRE(is_float_storage(*o.param_dtype), ErrorCode::InvalidArgument,
                     std::string("param_dtype ") + to_string(*o.param_dtype) + " is not one of f32, bf16, f16");
    for (auto& s : specs) s.dtype = *o.param_dtype;
  }
  LayoutOptions lo;
  lo.bucket_numel = o.bucket_numel;
  return Layout(std::move(specs), world, lo);
}

void check_options(const DistributedAdamOptions& o) {
  SHARDOPT_REQUIRE(is_float_storage(o.grad_dtype), ErrorCode::InvalidArgument,
                   std::string("grad_dtype ") + to_string(o.grad_dtype) + " is not one of f32, bf16, f16");
  SHARDOPT_REQUIRE(o.moment_dtype == DType::f32 || o.moment_dtype == DType::bf16, ErrorCode::InvalidArgument,
                   "moment_dtype must be f32 or bf16");
  SHARDOPT_REQUIRE(o.clip_max_norm >= 0.0f, ErrorCode::InvalidArgument,
                   "clip_max_norm must be >= 0 (0 disables clipping)");
  SHARDOPT_REQUIRE(o.microbatches >= 1, ErrorCode::InvalidArgument, "microbatches must be >= 1");
  SHARDOPT_REQUIRE(o.beta1 >= 0.0f && o.beta1 < 1.0f && o.beta2 >= 0.0f && o.beta2 < 1.0f, ErrorCode::InvalidArgument,
                   "beta1 and beta2 must lie in [0, 1)");
  SHARDOPT_REQUIRE(o.eps > 0.0f, ErrorCode::InvalidArgument, "eps must be positive");
}

TensorView make_view(void* data, const Shape& shape, DType dtype) {
  TensorView v;
  v.data = data;
  v.shape = shape;
  v.strides = row_major_strides(shape);
  v.dtype = dtype;
  return v;
}

}  // namespace

/// One layout buffer's shard: chunk table, fp32 master, moments and the kernel pointers.
struct BufferShard {
  std::vector<ShardChunk> chunks;
  DeviceBuffer chunks_dev;
  DeviceBuffer master, exp_avg, exp_avg_sq;
  AdamConfig config;
  ShardPointers ptrs;
  std::int64_t real_numel = 0;  // shard elements that belong to params
};

/// Where this rank's piece of one parameter lives (length 0: none).
struct ParamShard {
  int buffer = 0;
  std::int64_t param_offset = 0;
  std::int64_t shard_offset = 0;
  std::int64_t buffer_offset = 0;
  std::int64_t length = 0;
};

class DistributedAdam::Impl {
 public:
  Impl(Communicator c, std::vector<ParamSpec> specs, DistributedAdamOptions o)
      : comm(std::move(c)),
        opt(std::move(o)),
        backend(comm.backend()),
        store(comm, make_layout(std::move(specs), comm.size(), opt),
              BucketStoreOptions{opt.grad_dtype, true, opt.nccl_registered, opt.grad_reduce}) {
    const Layout& L = store.layout();
    const int rank = comm.rank();
    SHARDOPT_REQUIRE(static_cast<int>(L.groups().size()) <= kMaxAdamGroups, ErrorCode::InvalidArgument,
                     "the specs use " + std::to_string(L.groups().size()) + " optimizer groups; at most " +
                         std::to_string(kMaxAdamGroups) + " are supported");
    for (const auto& [name, g] : opt.groups) {
      SHARDOPT_REQUIRE(std::find(L.groups().begin(), L.groups().end(), name) != L.groups().end(),
                       ErrorCode::InvalidArgument,
                       "options name optimizer group '" + name + "', which no ParamSpec uses");
    }
    pshard.resize(L.params().size());
    shards.resize(L.buffers().size());
    for (std::size_t b = 0; b < L.buffers().size(); ++b) {
      BufferShard& sh = shards[b];
      const std::int64_t n = L.buffers()[b].shard_numel;
      sh.chunks = shard_chunks(L, static_cast<int>(b), rank);
      for (const auto& seg : L.segments(static_cast<int>(b), rank)) {
        ParamShard& ps = pshard[static_cast<std::size_t>(seg.param)];
        ps.buffer = static_cast<int>(b);
        ps.param_offset = seg.param_offset;
        ps.shard_offset = seg.shard_offset;
        ps.length = seg.length;
        ps.buffer_offset = L.params()[static_cast<std::size_t>(seg.param)].offset + seg.param_offset;
        sh.real_numel += seg.length;
      }
      sh.chunks_dev = DeviceBuffer(backend, sh.chunks.size() * sizeof(ShardChunk));
      copy_async(backend, sh.chunks_dev.data(), sh.chunks.data(), sh.chunks.size() * sizeof(ShardChunk), nullptr);
      sh.master = DeviceBuffer(backend, static_cast<std::size_t>(n) * 4);
      sh.exp_avg = DeviceBuffer(backend, static_cast<std::size_t>(n) * size_of(opt.moment_dtype));
      sh.exp_avg_sq = DeviceBuffer(backend, static_cast<std::size_t>(n) * size_of(opt.moment_dtype));
      fill_zero_async(backend, sh.master.data(), sh.master.bytes(), nullptr);
      fill_zero_async(backend, sh.exp_avg.data(), sh.exp_avg.bytes(), nullptr);
      fill_zero_async(backend, sh.exp_avg_sq.data(), sh.exp_avg_sq.bytes(), nullptr);

      AdamConfig& cfg = sh.config;
      cfg.beta1 = opt.beta1;
      cfg.beta2 = opt.beta2;
      cfg.eps = opt.eps;
      cfg.decoupled_weight_decay = opt.decoupled_weight_decay;
      cfg.grad_dtype = opt.grad_dtype;
      cfg.param_dtype = L.buffers()[b].dtype;
      cfg.write_params = true;
      cfg.moment_dtype = opt.moment_dtype;
      cfg.groups.clear();
      for (const auto& gname : L.groups()) {
        auto it = opt.groups.find(gname);
        cfg.groups.push_back(it != opt.groups.end() ? it->second : opt.default_group);
      }

      ShardPointers& p = sh.ptrs;
      p.chunks = sh.chunks_dev.as<ShardChunk>();
      p.num_chunks = static_cast<std::int64_t>(sh.chunks.size());
      p.shard_numel = n;
      p.grads = store.grad_buffer(static_cast<int>(b));
      p.params = store.param_buffer(static_cast<int>(b));
      p.master = sh.master.as<float>();
      p.exp_avg = sh.exp_avg.data();
      p.exp_avg_sq = sh.exp_avg_sq.data();
    }

    scalars = DeviceBuffer(backend, sizeof(StepScalars));
    const StepScalars init{};
    copy_async(backend, scalars.data(), &init, sizeof init, nullptr);
    microbatch = DeviceBuffer(backend, sizeof(MicrobatchState));
    MicrobatchState mb{};
    mb.count = opt.microbatches;
    mb.last = opt.microbatches == 1 ? 1 : 0;
    copy_async(backend, microbatch.data(), &mb, sizeof mb, nullptr);
    slots = DeviceBuffer(backend, 2 * sizeof(float), MemoryKind::Pinned);
    slots.as<float>()[0] = opt.lr_schedule.peak;  // lr for LrSchedule::Kind::Host
    slots.as<float>()[1] = 1.0f;                  // inverse loss scale
    readback = DeviceBuffer(backend, sizeof(StepScalars), MemoryKind::Pinned);
    synchronize(backend, nullptr);
  }

  StepScalars* dev_scalars() const { return scalars.as<StepScalars>(); }

  const ParamShard& shard_of(int i) const {
    SHARDOPT_REQUIRE(i >= 0 && i < static_cast<int>(pshard.size()), ErrorCode::OutOfRange,
                     "param index " + std::to_string(i) + " is out of range [0, " + std::to_string(pshard.size()) + ")");
    return pshard[static_cast<std::size_t>(i)];
  }

  void wait_pending_gathers(Stream stream) {
    for (int b = 0; b < static_cast<int>(store.layout().buckets().size()); ++b)
      if (store.param_gather_pending(b)) store.wait_param_gather(b, stream);
  }

  Communicator comm;
  DistributedAdamOptions opt;
  Backend backend;
  BucketStore store;
  std::vector<BufferShard> shards;
  std::vector<ParamShard> pshard;
  DeviceBuffer scalars, microbatch, slots, readback;
  std::map<std::pair<int, DType>, DeviceBuffer> copies;
  bool copies_requested = false;
  bool grad_sync = true;
};

DistributedAdam::DistributedAdam(Communicator comm, std::vector<ParamSpec> specs, DistributedAdamOptions options) {
  SHARDOPT_REQUIRE(comm.valid(), ErrorCode::InvalidArgument, "DistributedAdam needs a valid Communicator");
  check_options(options);
  impl_ = std::make_unique<Impl>(std::move(comm), std::move(specs), std::move(options));
}

DistributedAdam::~DistributedAdam() = default;
DistributedAdam::DistributedAdam(DistributedAdam&&) noexcept = default;
DistributedAdam& DistributedAdam::operator=(DistributedAdam&&) noexcept = default;

const Layout& DistributedAdam::layout() const noexcept { return impl_->store.layout(); }
const Communicator& DistributedAdam::comm() const noexcept { return impl_->comm; }
const DistributedAdamOptions& DistributedAdam::options() const noexcept { return impl_->opt; }
Backend DistributedAdam::backend() const noexcept { return impl_->backend; }
int DistributedAdam::num_params() const noexcept { return static_cast<int>(layout().params().size()); }
int DistributedAdam::param_index(const std::string& name) const { return layout().param_index(name); }

ParamView DistributedAdam::param(int i) const {
  (void)impl_->shard_of(i);
  const auto& spec = layout().specs()[static_cast<std::size_t>(i)];
  return ParamView{make_view(impl_->store.param_data(i), spec.shape, layout().buffers()[static_cast<std::size_t>(
                                                                        layout().params()[static_cast<std::size_t>(i)].buffer)].dtype)};
}

GradView DistributedAdam::grad(int i) const {
  (void)impl_->shard_of(i);
  const auto& spec = layout().specs()[static_cast<std::size_t>(i)];
  return GradView{make_view(impl_->store.grad_data(i), spec.shape, impl_->opt.grad_dtype)};
}

namespace {
Shape member_shape_of(const ParamSpec& s) {
  return s.member_shapes.empty() ? s.shape : s.member_shapes.front();
}
}  // namespace

ParamView DistributedAdam::member_param(int i, int m) const {
  ParamView whole = param(i);
  const auto& pl = layout().params()[static_cast<std::size_t>(i)];
  SHARDOPT_REQUIRE(m >= 0 && m < pl.members, ErrorCode::OutOfRange,
                   "member " + std::to_string(m) + " of '" + layout().specs()[static_cast<std::size_t>(i)].name +
                       "' is out of range [0, " + std::to_string(pl.members) + ")");
  auto* base = static_cast<char*>(whole.data) + static_cast<std::size_t>(m * pl.member_numel) * size_of(whole.dtype);
  return ParamView{make_view(base, member_shape_of(layout().specs()[static_cast<std::size_t>(i)]), whole.dtype)};
}

GradView DistributedAdam::member_grad(int i, int m) const {
  GradView whole = grad(i);
  const auto& pl = layout().params()[static_cast<std::size_t>(i)];
  SHARDOPT_REQUIRE(m >= 0 && m < pl.members, ErrorCode::OutOfRange,
                   "member " + std::to_string(m) + " of '" + layout().specs()[static_cast<std::size_t>(i)].name +
                       "' is out of range [0, " + std::to_string(pl.members) + ")");
  auto* base = static_cast<char*>(whole.data) + static_cast<std::size_t>(m * pl.member_numel) * size_of(whole.dtype);
  return GradView{make_view(base, member_shape_of(layout().specs()[static_cast<std::size_t>(i)]), whole.dtype)};
}

ShardView DistributedAdam::shard_param(int i) const {
  const ParamShard& ps = impl_->shard_of(i);
  const DType dt = layout().buffers()[static_cast<std::size_t>(layout().params()[static_cast<std::size_t>(i)].buffer)].dtype;
  ShardView v;
  v.dtype = dt;
  v.shape = {ps.length};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  v.data = ps.length == 0 ? nullptr
                          : static_cast<char*>(impl_->store.param_buffer(ps.buffer)) +
                                static_cast<std::size_t>(ps.buffer_offset) * size_of(dt);
  return v;
}

ShardView DistributedAdam::shard_master(int i) const {
  const ParamShard& ps = impl_->shard_of(i);
  ShardView v;
  v.dtype = DType::f32;
  v.shape = {ps.length};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  v.data = ps.length == 0 ? nullptr : impl_->shards[static_cast<std::size_t>(ps.buffer)].master.as<float>() + ps.shard_offset;
  return v;
}

namespace {
ShardView moment_view(const ParamShard& ps, const DeviceBuffer& buf, DType dt) {
  ShardView v;
  v.dtype = dt;
  v.shape = {ps.length};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  v.data = ps.length == 0 ? nullptr : static_cast<char*>(buf.data()) + static_cast<std::size_t>(ps.shard_offset) * size_of(dt);
  return v;
}
}  // namespace

ShardView DistributedAdam::shard_exp_avg(int i) const {
  const ParamShard& ps = impl_->shard_of(i);
  return moment_view(ps, impl_->shards[static_cast<std::size_t>(ps.buffer)].exp_avg, impl_->opt.moment_dtype);
}

ShardView DistributedAdam::shard_exp_avg_sq(int i) const {
  const ParamShard& ps = impl_->shard_of(i);
  return moment_view(ps, impl_->shards[static_cast<std::size_t>(ps.buffer)].exp_avg_sq, impl_->opt.moment_dtype);
}

ShardView DistributedAdam::shard_grad(int i, DType dtype, Stream stream) {
  const ParamShard& ps = impl_->shard_of(i);
  SHARDOPT_REQUIRE(is_float_storage(dtype), ErrorCode::InvalidArgument,
                   std::string("shard_grad: dtype ") + to_string(dtype) + " is not one of f32, bf16, f16");
  const DType gdt = impl_->opt.grad_dtype;
  ShardView v;
  v.dtype = dtype;
  v.shape = {ps.length};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  if (ps.length == 0) return v;
  void* src = static_cast<char*>(impl_->store.grad_buffer(ps.buffer)) + static_cast<std::size_t>(ps.buffer_offset) * size_of(gdt);
  if (dtype == gdt) {
    v.data = src;  // a view of the reduce-scattered shard: no copy
    return v;
  }
  impl_->copies_requested = true;
  const auto key = std::make_pair(i, dtype);
  auto it = impl_->copies.find(key);
  if (it == impl_->copies.end()) {
    SHARDOPT_REQUIRE(!is_capturing(impl_->backend, stream), ErrorCode::CaptureRefused,
                     "shard_grad('" + layout().specs()[static_cast<std::size_t>(i)].name + "', " + to_string(dtype) +
                         ") would allocate a cast copy inside a capture; call it once before capturing (a warm-up "
                         "iteration) with DistributedAdamOptions::persistent_grad_copies = true");
    it = impl_->copies
             .emplace(key, DeviceBuffer(impl_->backend, static_cast<std::size_t>(ps.length) * size_of(dtype)))
             .first;
  }
  kernels::convert(src, gdt, it->second.data(), dtype, ps.length, impl_->backend, stream);
  v.data = it->second.data();
  return v;
}

void DistributedAdam::init_master(Stream stream) {
  const Layout& L = layout();
  const int rank = impl_->comm.rank();
  for (std::size_t b = 0; b < L.buffers().size(); ++b) {
    const DType dt = L.buffers()[b].dtype;
    for (int bk : L.buffers()[b].buckets) {
      const Range own = L.shard_range(bk, rank);
      const auto& bucket = L.buckets()[static_cast<std::size_t>(bk)];
      const void* src = static_cast<const char*>(impl_->store.param_buffer(static_cast<int>(b))) +
                        static_cast<std::size_t>(own.begin) * size_of(dt);
      kernels::convert(src, dt, impl_->shards[b].master.as<float>() + bucket.shard_offset, DType::f32, own.size(),
                       impl_->backend, stream);
    }
  }
  impl_->wait_pending_gathers(stream);
  for (int b = 0; b < static_cast<int>(L.buckets().size()); ++b) {
    impl_->store.start_param_gather(b, stream);
    impl_->store.wait_param_gather(b, stream);
  }
}

void DistributedAdam::grad_ready(int i, Stream stream) {
  (void)impl_->shard_of(i);
  if (!impl_->grad_sync || !impl_->opt.overlap_grad_reduce) return;
  impl_->store.grad_ready(i, stream);
}

void DistributedAdam::set_grad_sync(bool enabled) noexcept { impl_->grad_sync = enabled; }
bool DistributedAdam::grad_sync() const noexcept { return impl_->grad_sync; }

void DistributedAdam::reduce_grads(Stream stream) {
  const int nb = static_cast<int>(layout().buckets().size());
  for (int b = 0; b < nb; ++b)
    if (!impl_->store.grad_reduce_pending(b)) impl_->store.start_grad_reduce(b, stream);
  for (int b = 0; b < nb; ++b) impl_->store.wait_grad_reduce(b, stream);
}

void DistributedAdam::step(Stream stream) {
  Impl& m = *impl_;
  const Backend be = m.backend;
  StepScalars* sc = m.dev_scalars();
  reduce_grads(stream);

  // Per-step values, all on the device: lr, inverse loss scale, fresh norm accumulators.
  if (m.opt.lr_schedule.kind == LrSchedule::Kind::Host) {
    copy_async(be, &sc->lr, m.slots.as<float>(), sizeof(float), stream);
  } else {
    kernels::apply_lr_schedule(m.opt.lr_schedule, nullptr, sc, be, stream);
  }
  copy_async(be, &sc->inv_loss_scale, m.slots.as<float>() + 1, sizeof(float), stream);
  fill_zero_async(be, &sc->grad_sumsq, 2 * sizeof(float), stream);

  // Global norm and found-inf: shard partial sums, one all-reduce of two adjacent floats.
  for (const auto& sh : m.shards) accumulate_grad_sumsq(m.opt.grad_dtype, sh.ptrs, sc, be, stream);
  if (m.comm.size() > 1) m.comm.all_reduce(&sc->grad_sumsq, 2, DType::f32, ReduceOp::Sum, stream);
  finalize_grad_norm(m.opt.clip_max_norm, sc, be, stream);

  // Adam writes the param slices: gathers of the previous step must be done with them.
  m.wait_pending_gathers(stream);
  adam_prologue(m.shards.front().config, sc, be, stream);
  for (const auto& sh : m.shards) adam_update(sh.config, sh.ptrs, sc, be, stream);
  gather_params(stream);
}

void DistributedAdam::gather_params(Stream stream) {
  const bool defer = impl_->opt.overlap_param_gather && !is_capturing(impl_->backend, stream);
  impl_->wait_pending_gathers(stream);
  const int nb = static_cast<int>(layout().buckets().size());
  for (int b = 0; b < nb; ++b) impl_->store.start_param_gather(b, stream);
  if (!defer)
    for (int b = 0; b < nb; ++b) impl_->store.wait_param_gather(b, stream);
}

void DistributedAdam::wait_param(int bucket, Stream stream) {
  SHARDOPT_REQUIRE(bucket >= 0 && bucket < static_cast<int>(layout().buckets().size()), ErrorCode::OutOfRange,
                   "bucket " + std::to_string(bucket) + " is out of range [0, " +
                       std::to_string(layout().buckets().size()) + ")");
  if (impl_->store.param_gather_pending(bucket)) impl_->store.wait_param_gather(bucket, stream);
}

void DistributedAdam::zero_grad(Stream stream) {
  Impl& m = *impl_;
  for (std::size_t b = 0; b < layout().buffers().size(); ++b) {
    const std::size_t bytes = static_cast<std::size_t>(layout().buffers()[b].numel) * size_of(m.opt.grad_dtype);
    fill_zero_async(m.backend, m.store.grad_buffer(static_cast<int>(b)), bytes, stream);
  }
  if (!m.opt.persistent_grad_copies && !m.copies.empty()) {
    SHARDOPT_REQUIRE(!is_capturing(m.backend, stream), ErrorCode::CaptureRefused,
                     "zero_grad would free shard_grad cast copies inside a capture; set "
                     "DistributedAdamOptions::persistent_grad_copies = true for graph mode");
    synchronize(m.backend, stream);  // the copies may still be read by queued work
    m.copies.clear();
  }
}

void DistributedAdam::set_lr(float lr) { impl_->slots.as<float>()[0] = lr; }

void DistributedAdam::set_loss_scale(float scale) {
  SHARDOPT_REQUIRE(scale > 0.0f, ErrorCode::InvalidArgument, "loss scale must be positive");
  impl_->slots.as<float>()[1] = 1.0f / scale;
}

StepScalars* DistributedAdam::device_scalars() const noexcept { return impl_->dev_scalars(); }

StepScalars DistributedAdam::read_scalars(Stream stream) const {
  SHARDOPT_REQUIRE(!is_capturing(impl_->backend, stream), ErrorCode::InvalidState,
                   "read_scalars() synchronizes and cannot run inside a capture; read device_scalars() from a "
                   "kernel instead, or call it after replay");
  copy_async(impl_->backend, impl_->readback.data(), impl_->dev_scalars(), sizeof(StepScalars), stream);
  synchronize(impl_->backend, stream);
  StepScalars out;
  std::memcpy(&out, impl_->readback.data(), sizeof out);
  return out;
}

MicrobatchState* DistributedAdam::device_microbatch() const noexcept {
  return impl_->microbatch.as<MicrobatchState>();
}

void DistributedAdam::advance_microbatch(Stream stream) {
  kernels::advance_microbatch(device_microbatch(), impl_->backend, stream);
}

MemoryReport DistributedAdam::memory() const {
  const Impl& m = *impl_;
  MemoryReport r;
  r.params = static_cast<std::int64_t>(m.store.param_bytes());
  r.grads = static_cast<std::int64_t>(m.store.grad_bytes());
  r.nccl_overhead = static_cast<std::int64_t>(m.store.allocator_overhead_bytes());
  const std::int64_t msize = static_cast<std::int64_t>(size_of(m.opt.moment_dtype));
  std::int64_t shard_pad = 0;
  for (const auto& sh : m.shards) {
    r.master += static_cast<std::int64_t>(sh.master.bytes());
    r.moments += static_cast<std::int64_t>(sh.exp_avg.bytes() + sh.exp_avg_sq.bytes());
    shard_pad += sh.ptrs.shard_numel - sh.real_numel;
  }
  for (const auto& [key, buf] : m.copies) r.copies += static_cast<std::int64_t>(buf.bytes());
  std::int64_t pad_bytes = 0;
  for (const auto& buf : layout().buffers()) {
    std::int64_t real = 0;
    for (int p : buf.params) real += layout().params()[static_cast<std::size_t>(p)].numel;
    pad_bytes += (buf.numel - real) * static_cast<std::int64_t>(size_of(buf.dtype) + size_of(m.opt.grad_dtype));
  }
  r.padding = pad_bytes + shard_pad * (4 + 2 * msize);
  return r;
}

void DistributedAdam::check_capturable() const {
  SHARDOPT_REQUIRE(!impl_->copies_requested || impl_->opt.persistent_grad_copies, ErrorCode::CaptureRefused,
                   "this optimizer hands out shard_grad cast copies, which zero_grad frees; capturing its step would "
                   "free memory inside the graph. Set DistributedAdamOptions::persistent_grad_copies = true (graph "
                   "mode: copies persist and are reported under MemoryReport::copies)");
}

}  // namespace shardopt
