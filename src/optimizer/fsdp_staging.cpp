// Fsdp: the staging. The gathers of a position's native parts into its parameter slot and
// of its MXFP8 plane into a staging half of the gradient slot, their landing (the host
// backend's Landing), the staging halves' checked states, and the calls that read them.
#include <optional>
#include <string>

#include "comm/deadline.hpp"
#include "core/check.hpp"
#include "core/trace.hpp"
#include "optimizer/fsdp_impl.hpp"
#include "quantized/mxfp8_params.hpp"
#include "shardopt/error.hpp"

namespace shardopt {

Stream Fsdp::Impl::fork_gather(Stream stream) {
  const Stream gs = gather_stream.on(stream);
  if (gs != stream) {
    gather_go.record(stream);
    gather_go.wait(gs);
  }
  return gs;
}

template <class Pick, class Shard>
void Fsdp::Impl::gather_parts(int u, char* base, std::size_t esize, DType dt, FsdpPass pass, bool mxfp8, Pick pick,
                              Shard shard, Stream gs) {
  const UnitInfo& ui = info[static_cast<std::size_t>(u)];
  const int r = shard_comm.rank();
  for (int b : ui.buckets) {
    const Bucket& bk = layout.buckets()[static_cast<std::size_t>(b)];
    if (!pick(bk.buffer)) continue;
    const Part& part = ui.parts[static_cast<std::size_t>(bk.buffer)];
    const std::int64_t count = bk.range.size() / shard_size;
    char* at = base + static_cast<std::size_t>(bk.range.begin - part.begin + part.at) * esize;
    copy_async(backend, at + static_cast<std::size_t>(r * count) * esize,
               static_cast<const char*>(static_cast<const void*>(shard(bk.buffer))) +
                   static_cast<std::size_t>(bk.shard_offset) * esize,
               static_cast<std::size_t>(count) * esize, gs);
    std::optional<detail::OperationLabel> label;  // names the unit if a host-backend wait times out
    if (backend == Backend::Host) label.emplace("unit '" + unit_name(u) + "' parameter all-gather");
    shard_comm.all_gather(at, count, dt, gs);
    const auto bytes = static_cast<std::int64_t>(count * shard_size) * static_cast<std::int64_t>(esize);
    ++stats.calls;
    (pass == FsdpPass::Forward ? stats.forward_bytes : stats.backward_bytes) += bytes;
    if (mxfp8) stats.mxfp8_bytes += bytes;
  }
}

void Fsdp::Impl::gather_native(std::size_t k, Stream stream) {
  SHARDOPT_TRACE_INDEXED("shardopt/all_gather unit", order[k]);
  const Stream gs = fork_gather(stream);
  const int slot = slot_of[k];
  char* base = slot_landing[static_cast<std::size_t>(slot)].receive(
      static_cast<char*>(param_slots[static_cast<std::size_t>(slot)].data()),
      static_cast<std::size_t>(info[static_cast<std::size_t>(order[k])].native) * psize);
  gather_parts(
      order[k], base, psize, opt.param_dtype,
      pass_of[k], false, [this](int b) { return !quantized[static_cast<std::size_t>(b)]; },
      [this](int b) { return param_shards[static_cast<std::size_t>(b)].data(); }, gs);
  slot_ready[static_cast<std::size_t>(slot)].record(gs);
}

void Fsdp::Impl::gather_mx(std::size_t k, Stream stream) {
  const int u = order[k];
  SHARDOPT_TRACE_INDEXED("shardopt/all_gather mxfp8 unit", u);
  SHARDOPT_REQUIRE(grad_unit < 0, ErrorCode::InvalidState,
                   "wait_param('" + unit_name(u) + "') gathers its MXFP8 plane through the gradient slot, which unit '" +
                       (grad_unit >= 0 ? unit_name(grad_unit) : std::string()) +
                       "' holds; call grad_ready for that unit first");
  const int h = half_of[k];
  // The half's earlier bytes were read by work queued on `stream` before now (a pass
  // of an earlier position), which the gather follows: they are dead.
  retire_half(h);
  const Stream gs = fork_gather(stream);
  if (reduce_pending && gs != stream) grad_free.wait(gs);  // the slot's last reduce-scatter read it
  const Mxfp8Plane plane = pass_of[k] == FsdpPass::Forward ? Mxfp8Plane::Rowwise : Mxfp8Plane::Columnwise;
  char* base = half_landing[static_cast<std::size_t>(h)].receive(
      half_base(h), static_cast<std::size_t>(info[static_cast<std::size_t>(u)].mx));
  gather_parts(
      u, base, 1, DType::e4m3, pass_of[k], true, [this](int b) { return quantized[static_cast<std::size_t>(b)]; },
      [this, plane](int b) { return detail::mxfp8_shard_plane(*mx->format(), b, plane); }, gs);
  stage_ready[static_cast<std::size_t>(h)].record(gs);
  advance_half(h, GatherState::InFlight);
  staged_end[static_cast<std::size_t>(h)] =
      static_cast<std::size_t>(h) * static_cast<std::size_t>(max_mx) + static_cast<std::size_t>(info[static_cast<std::size_t>(u)].mx);
}

void Fsdp::Impl::wait_slot(int slot, Stream stream) {
  slot_ready[static_cast<std::size_t>(slot)].wait(stream);
  slot_landing[static_cast<std::size_t>(slot)].land(backend, stream);
}

void Fsdp::Impl::wait_half(int h, Stream stream) {
  stage_ready[static_cast<std::size_t>(h)].wait(stream);
  half_landing[static_cast<std::size_t>(h)].land(backend, stream);
}

void Fsdp::Impl::advance_half(int h, GatherState to) {
  detail::advance_gather(staging[static_cast<std::size_t>(h)], to,
                         [h] { return "FSDP gradient-slot staging half " + std::to_string(h); });
}

void Fsdp::Impl::retire_half(int h) {
  if (staging[static_cast<std::size_t>(h)] == GatherState::Landed) advance_half(h, GatherState::Consumed);
  if (staging[static_cast<std::size_t>(h)] == GatherState::Consumed) advance_half(h, GatherState::Idle);
}

void Fsdp::Impl::land_mx(std::size_t k, Stream stream) {
  const int h = half_of[k];
  wait_half(h, stream);
  advance_half(h, GatherState::Landed);
  const int u = order[k];
  if (pass_of[k] == FsdpPass::Backward) {
    copy_async(backend, col_slot.data(), half_base(h), static_cast<std::size_t>(info[static_cast<std::size_t>(u)].mx),
               stream);
    advance_half(h, GatherState::Consumed);
    place_of[static_cast<std::size_t>(u)] = 2;
  } else {
    place_of[static_cast<std::size_t>(u)] = h;
  }
  pass_now[static_cast<std::size_t>(u)] = pass_of[k];
}

Mxfp8PassView Fsdp::mxfp8_param(int i, FsdpPass pass) const {
  const Impl& m = impl();
  (void)m.state.piece(i);
  const auto& pl = m.layout.params()[static_cast<std::size_t>(i)];
  const std::string& name = m.layout.specs()[static_cast<std::size_t>(i)].name;
  SHARDOPT_REQUIRE(m.mx_mode() && m.quantized[static_cast<std::size_t>(pl.buffer)], ErrorCode::InvalidArgument,
                   "mxfp8_param('" + name + "'): not an MXFP8 parameter (" +
                       (m.mx_mode() ? "1-D parameters stay native" : "param_format is Native") +
                       "); read it from wait_param's views");
  const int u = m.unit_of_param[static_cast<std::size_t>(i)];
  const int place = m.place_of[static_cast<std::size_t>(u)];
  SHARDOPT_REQUIRE(place >= 0, ErrorCode::InvalidState,
                   "mxfp8_param('" + name + "') before wait_param gathered its unit '" + m.unit_name(u) + "'");
  const FsdpPass has = m.pass_now[static_cast<std::size_t>(u)];
  SHARDOPT_REQUIRE(has == pass, ErrorCode::InvalidArgument,
                   std::string("mxfp8_param('") + name + "', " + Impl::pass_name(pass) + ") asks for the " +
                       Impl::plane_name(pass) + " plane, but unit '" + m.unit_name(u) + "' was last gathered for its " +
                       Impl::pass_name(has) + " pass, which moves the " + Impl::plane_name(has) +
                       " plane only (the forward GEMM reads rowwise, "
                       "the data-gradient GEMM columnwise)");
  const Impl::Part& part = m.info[static_cast<std::size_t>(u)].parts[static_cast<std::size_t>(pl.buffer)];
  const char* base = place == 2 ? static_cast<const char*>(m.col_slot.data()) : m.half_base(place);
  const Mxfp8View whole = detail::mxfp8_view(*m.mx->format(), i);
  Mxfp8PassView v;
  v.shape = whole.shape;
  v.pass = pass;
  v.plane = pass == FsdpPass::Forward ? Mxfp8Plane::Rowwise : Mxfp8Plane::Columnwise;
  v.data = reinterpret_cast<const std::uint8_t*>(base) + (pl.offset - part.begin + part.at);
  v.scales = pass == FsdpPass::Forward ? whole.planes.scale_row : whole.planes.scale_col;
  v.members = whole.members;
  return v;
}

GatherState Fsdp::staging_state(int half) const {
  SHARDOPT_REQUIRE(half == 0 || half == 1, ErrorCode::OutOfRange, "staging_state: half must be 0 or 1");
  return impl().staging[static_cast<std::size_t>(half)];
}

FsdpGatherStats Fsdp::gather_stats() const { return impl().stats; }

}  // namespace shardopt
