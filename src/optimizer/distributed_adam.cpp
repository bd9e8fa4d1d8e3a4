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
#include "optimizer/shard_state.hpp"
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

detail::AdamHyper hyper_of(const DistributedAdamOptions& o) {
  detail::AdamHyper h;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.decoupled_weight_decay = o.decoupled_weight_decay;
  h.grad_dtype = o.grad_dtype;
  h.moment_dtype = o.moment_dtype;
  h.default_group = o.default_group;
  h.groups = o.groups;
  h.clip_max_norm = o.clip_max_norm;
  h.lr_schedule = o.lr_schedule;
  h.microbatches = o.microbatches;
  return h;
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

class DistributedAdam::Impl {
 public:
  Impl(Communicator c, std::vector<ParamSpec> specs, DistributedAdamOptions o)
      : comm(std::move(c)),
        opt(std::move(o)),
        backend(comm.backend()),
        store(comm, make_layout(std::move(specs), comm.size(), opt),
              BucketStoreOptions{opt.grad_dtype, true, opt.nccl_registered, opt.grad_reduce}),
        state(backend, store.layout(), comm.rank(), hyper_of(opt), /*shard_addressed=*/false) {
    for (int b = 0; b < static_cast<int>(store.layout().buffers().size()); ++b)
      state.bind(b, store.grad_buffer(b), store.param_buffer(b));
  }

  void wait_pending_gathers(Stream stream) {
    for (int b = 0; b < static_cast<int>(store.layout().buckets().size()); ++b)
      if (store.param_gather_pending(b)) store.wait_param_gather(b, stream);
  }

  Communicator comm;
  DistributedAdamOptions opt;
  Backend backend;
  BucketStore store;
  detail::ShardState state;
  std::map<std::pair<int, DType>, DeviceBuffer> copies;
  bool copies_requested = false;
  bool grad_sync = true;
  bool grads_reduced = false;  // reduce_grads() ran since the last step / zero_grad
};

DistributedAdam::DistributedAdam(Communicator comm, std::vector<ParamSpec> specs, DistributedAdamOptions options) {
  SHARDOPT_REQUIRE(comm.valid(), ErrorCode::InvalidArgument, "DistributedAdam needs a valid Communicator");
  detail::validate(hyper_of(options));
  SHARDOPT_REQUIRE(options.gather_pipeline >= 1, ErrorCode::InvalidArgument,
                   "gather_pipeline must be >= 1 (1 = no pipelining)");
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
  (void)impl_->state.piece(i);
  const auto& spec = layout().specs()[static_cast<std::size_t>(i)];
  const DType dt = layout().buffers()[static_cast<std::size_t>(layout().params()[static_cast<std::size_t>(i)].buffer)].dtype;
  return ParamView{make_view(impl_->store.param_data(i), spec.shape, dt)};
}

GradView DistributedAdam::grad(int i) const {
  (void)impl_->state.piece(i);
  const auto& spec = layout().specs()[static_cast<std::size_t>(i)];
  return GradView{make_view(impl_->store.grad_data(i), spec.shape, impl_->opt.grad_dtype)};
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
  return ParamView{make_view(member_base(layout(), i, m, whole.data, whole.dtype),
                             member_shape_of(layout().specs()[static_cast<std::size_t>(i)]), whole.dtype)};
}

GradView DistributedAdam::member_grad(int i, int m) const {
  const GradView whole = grad(i);
  return GradView{make_view(member_base(layout(), i, m, whole.data, whole.dtype),
                            member_shape_of(layout().specs()[static_cast<std::size_t>(i)]), whole.dtype)};
}

ShardView DistributedAdam::shard_param(int i) const {
  const detail::ParamPiece& ps = impl_->state.piece(i);
  const DType dt = layout().buffers()[static_cast<std::size_t>(ps.buffer)].dtype;
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

ShardView DistributedAdam::shard_master(int i) const { return impl_->state.master_view(i); }
ShardView DistributedAdam::shard_exp_avg(int i) const { return impl_->state.exp_avg_view(i); }
ShardView DistributedAdam::shard_exp_avg_sq(int i) const { return impl_->state.exp_avg_sq_view(i); }

ShardView DistributedAdam::shard_grad(int i, DType dtype, Stream stream) {
  const detail::ParamPiece& ps = impl_->state.piece(i);
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
  impl_->wait_pending_gathers(stream);
  impl_->state.init_master(stream);
  const int nb = static_cast<int>(layout().buckets().size());
  for (int b = 0; b < nb; ++b) impl_->store.start_param_gather(b, stream);
  for (int b = 0; b < nb; ++b) impl_->store.wait_param_gather(b, stream);
}

void DistributedAdam::grad_ready(int i, Stream stream) {
  (void)impl_->state.piece(i);
  if (!impl_->grad_sync || !impl_->opt.overlap_grad_reduce) return;
  impl_->store.grad_ready(i, stream);
}

void DistributedAdam::set_grad_sync(bool enabled) noexcept { impl_->grad_sync = enabled; }
bool DistributedAdam::grad_sync() const noexcept { return impl_->grad_sync; }

void DistributedAdam::reduce_grads(Stream stream) {
  const int nb = static_cast<int>(layout().buckets().size());
  if (impl_->opt.grouped_collectives) {
    impl_->store.start_grad_reduces(0, nb, stream);  // the buckets grad_ready did not start
  } else {
    for (int b = 0; b < nb; ++b)
      if (!impl_->store.grad_reduce_pending(b)) impl_->store.start_grad_reduce(b, stream);
  }
  for (int b = 0; b < nb; ++b) impl_->store.wait_grad_reduce(b, stream);
  impl_->grads_reduced = true;
}

void DistributedAdam::step(Stream stream) {
  Impl& m = *impl_;
  if (!m.grads_reduced) reduce_grads(stream);
  m.grads_reduced = false;
  // Adam writes the param slices: gathers of the previous step must be done with them.
  m.wait_pending_gathers(stream);
  m.state.begin_step(m.comm, stream);
  // Adam per group of buckets; each group's all-gather overlaps the next group's Adam.
  const int nb = static_cast<int>(layout().buckets().size());
  const int groups = std::max(1, std::min(m.opt.gather_pipeline, nb));
  for (int g = 0; g < groups; ++g) {
    const int first = static_cast<int>(static_cast<std::int64_t>(nb) * g / groups);
    const int last = static_cast<int>(static_cast<std::int64_t>(nb) * (g + 1) / groups);
    for (int b = first; b < last; ++b) {
      const auto [c0, c1] = m.state.bucket_chunks(b);
      m.state.apply(layout().buckets()[static_cast<std::size_t>(b)].buffer, c0, c1, stream);
    }
    if (m.opt.grouped_collectives) {
      m.store.start_param_gathers(first, last, stream);
    } else {
      for (int b = first; b < last; ++b) m.store.start_param_gather(b, stream);
    }
  }
  const bool defer = m.opt.overlap_param_gather && !is_capturing(m.backend, stream);
  if (!defer)
    for (int b = 0; b < nb; ++b) m.store.wait_param_gather(b, stream);
}

void DistributedAdam::gather_params(Stream stream) {
  const bool defer = impl_->opt.overlap_param_gather && !is_capturing(impl_->backend, stream);
  impl_->wait_pending_gathers(stream);
  const int nb = static_cast<int>(layout().buckets().size());
  if (impl_->opt.grouped_collectives) {
    impl_->store.start_param_gathers(0, nb, stream);
  } else {
    for (int b = 0; b < nb; ++b) impl_->store.start_param_gather(b, stream);
  }
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
  m.grads_reduced = false;
  for (std::size_t b = 0; b < layout().buffers().size(); ++b) {
    const std::size_t bytes = static_cast<std::size_t>(layout().buffers()[b].numel) * size_of(m.opt.grad_dtype);
    fill_zero_async(m.backend, m.store.grad_buffer(static_cast<int>(b)), bytes, stream);
  }
  if (!m.opt.persistent_grad_copies && !m.copies.empty()) {
    SHARDOPT_REQUIRE(!is_capturing(m.backend, stream), ErrorCode::CaptureRefused,
                     "zero_grad would free shard_grad cast copies inside a capture; set "
                     "DistributedAdamOptions::persistent_grad_copies = true for graph mode");
    synchronize(m.backend, stream);  // queued work may still read the copies
    m.copies.clear();
  }
}

void DistributedAdam::set_lr(float lr) { impl_->state.set_lr(lr); }
void DistributedAdam::set_loss_scale(float scale) { impl_->state.set_loss_scale(scale); }
StepScalars* DistributedAdam::device_scalars() const noexcept { return impl_->state.scalars(); }
StepScalars DistributedAdam::read_scalars(Stream stream) const { return impl_->state.read_scalars(stream); }
MicrobatchState* DistributedAdam::device_microbatch() const noexcept { return impl_->state.microbatch(); }
void DistributedAdam::advance_microbatch(Stream stream) { impl_->state.advance_microbatch(stream); }

MemoryReport DistributedAdam::memory() const {
  const Impl& m = *impl_;
  MemoryReport r;
  r.params = static_cast<std::int64_t>(m.store.param_bytes());
  r.grads = static_cast<std::int64_t>(m.store.grad_bytes());
  r.nccl_overhead = static_cast<std::int64_t>(m.store.allocator_overhead_bytes());
  m.state.add_memory(r);
  for (const auto& [key, buf] : m.copies) r.copies += static_cast<std::int64_t>(buf.bytes());
  for (const auto& buf : layout().buffers()) {
    std::int64_t real = 0;
    for (int p : buf.params) real += layout().params()[static_cast<std::size_t>(p)].numel;
    r.padding += (buf.numel - real) * static_cast<std::int64_t>(size_of(buf.dtype) + size_of(m.opt.grad_dtype));
  }
  return r;
}

void DistributedAdam::check_capturable() const {
  SHARDOPT_REQUIRE(!impl_->copies_requested || impl_->opt.persistent_grad_copies, ErrorCode::CaptureRefused,
                   "this optimizer hands out shard_grad cast copies, which zero_grad frees; capturing its step would "
                   "free memory inside the graph. Set DistributedAdamOptions::persistent_grad_copies = true (graph "
                   "mode: copies persist and are reported under MemoryReport::copies)");
}

}  // namespace shardopt
