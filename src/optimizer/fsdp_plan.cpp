// Fsdp: the iteration plan. The first iteration learns the order of wait_param calls and
// plans each position (its pass, its parameter slot, its MXFP8 staging half, whether it
// gathers); later iterations check the order and prefetch the next position's gathers.
#include <optional>
#include <string>

#include "core/check.hpp"
#include "optimizer/fsdp_impl.hpp"
#include "shardopt/error.hpp"

namespace shardopt {

std::vector<ParamView> Fsdp::wait_param(int unit, Stream stream) {
  Impl& m = impl();
  SHARDOPT_REQUIRE(!m.mx_mode(), ErrorCode::InvalidArgument,
                   "wait_param(unit, stream) with MXFP8 parameters: name the pass, wait_param(unit, "
                   "FsdpPass::Forward or FsdpPass::Backward, stream); each pass gathers only its plane");
  return m.wait_param(unit, std::nullopt, stream);
}

std::vector<ParamView> Fsdp::wait_param(int unit, FsdpPass pass, Stream stream) {
  return impl().wait_param(unit, pass, stream);
}

std::vector<ParamView> Fsdp::Impl::wait_param(int unit, std::optional<FsdpPass> pass, Stream stream) {
  Impl& m = *this;
  m.check_unit(unit);
  if (!m.state.initialized())
    m.state.require_initialized("wait_param('" + m.unit_name(unit) + "')", kInitCalls);
  const std::size_t k = m.pos;
  const int seen = m.seen[static_cast<std::size_t>(unit)];
  if (m.learned)
    SHARDOPT_REQUIRE(k < m.order.size() && m.order[k] == unit, ErrorCode::InvalidState,
                     "the unit order changed: wait_param #" + std::to_string(k) + " of this iteration asks for unit '" +
                         m.unit_name(unit) + "', but the order learned on the first iteration has " +
                         (k < m.order.size() ? "'" + m.unit_name(m.order[k]) + "'" : std::string("no more units")) +
                         " there; call wait_param in the same order every iteration");
  // The learning iteration records the pass the trainer names (a backward that needs no
  // weights, e.g. the embedding's, makes no call); without a name (native parameters),
  // a unit's calls alternate forward, backward. Later iterations check it.
  const FsdpPass expected = m.learned ? m.pass_of[k]
                            : pass    ? *pass
                                      : (seen % 2 == 0 ? FsdpPass::Forward : FsdpPass::Backward);
  if (!m.learned && pass == FsdpPass::Backward && seen == 0)
    throw Error(ErrorCode::InvalidArgument,
                "wait_param('" + m.unit_name(unit) + "', Backward) before the unit's forward in this iteration; "
                "a unit's first call of an iteration is its Forward (rowwise plane)");
  if (pass && *pass != expected)
    throw Error(ErrorCode::InvalidArgument,
                "wait_param('" + m.unit_name(unit) + "', " + pass_name(*pass) + "): position " + std::to_string(k) +
                    " of the iteration is this unit's call #" + std::to_string(seen + 1) + ", its " +
                    pass_name(expected) + " pass, which gathers the " + plane_name(expected) + " plane only; ask for " +
                    pass_name(expected) + " (a unit's calls alternate: forward, then backward, each microbatch)");
  if (!m.learned) {
    // First iteration: learn the order and plan a slot (and a staging half) per position.
    const bool keep = m.opt.keep_last_unit && !m.order.empty() && m.order.back() == unit;
    m.order.push_back(unit);
    m.pass_of.push_back(expected);
    m.needs_gather.push_back(keep || m.info[static_cast<std::size_t>(unit)].native == 0 ? 0 : 1);
    m.prefetched.push_back(0);
    m.mx_prefetched.push_back(0);
    if (keep) {
      m.slot_of.push_back(m.slot_of.back());
    } else {
      m.slot_of.push_back(m.next_slot);
      m.next_slot ^= 1;
    }
    if (m.mx_mode() && m.info[static_cast<std::size_t>(unit)].mx > 0) {
      m.half_of.push_back(m.next_half);
      m.next_half ^= 1;
    } else {
      m.half_of.push_back(-1);
    }
  }
  ++m.seen[static_cast<std::size_t>(unit)];
  ++m.pos;
  const int slot = m.slot_of[k];
  if (m.needs_gather[k]) {
    if (!m.prefetched[k]) m.gather_native(k, stream);
    m.prefetched[k] = 0;
    m.wait_slot(slot, stream);
  }
  if (m.has_mx(k)) {
    if (!m.mx_prefetched[k]) m.gather_mx(k, stream);
    m.mx_prefetched[k] = 0;
    if (m.pending_mx == k) m.pending_mx = npos;
    m.land_mx(k, stream);
  }
  if (m.learned && m.opt.prefetch) {
    // Prefetch the next gather of the iteration into the other slot, whose last user
    // is the work queued on `stream` before this call.
    for (std::size_t n = k + 1; n < m.order.size(); ++n) {
      if (!m.needs_gather[n]) continue;
      if (m.prefetched[n]) break;  // already on its way (we are at a kept position)
      m.gather_native(n, stream);
      m.prefetched[n] = 1;
      break;
    }
    // The next MXFP8 plane goes through the gradient slot: now during forward (the slot
    // is free), after this unit's grad_ready during backward (the slot then holds its
    // gradients until their reduce-scatter). A Forward position after a Backward one
    // (the next microbatch) is gathered by its own wait_param: gradient-only units (an
    // embedding's backward takes no weights) may still take the slot in between.
    const std::size_t n = m.next_mx(k);
    if (n < m.order.size() && !m.mx_prefetched[n]) {
      if (m.pass_of[k] == FsdpPass::Forward) {
        m.gather_mx(n, stream);
        m.mx_prefetched[n] = 1;
      } else if (m.pass_of[n] == FsdpPass::Backward) {
        m.pending_mx = n;
      }
    }
  }
  return m.unit_views<ParamView>(unit, m.param_slots[static_cast<std::size_t>(slot)].data(), m.opt.param_dtype, false);
}

std::size_t Fsdp::Impl::next_mx(std::size_t k) const {
  std::size_t n = k + 1;
  while (n < order.size() && !has_mx(n)) ++n;
  return n;
}

void Fsdp::end_forward_only(Stream stream) {
  Impl& m = impl();
  SHARDOPT_REQUIRE(m.grad_unit < 0, ErrorCode::InvalidState,
                   "end_forward_only while unit '" + (m.grad_unit >= 0 ? m.unit_name(m.grad_unit) : std::string()) +
                       "' holds the gradient slot; a forward-only pass takes no gradient slot");
  for (std::size_t k = 0; k < m.pos; ++k)
    SHARDOPT_REQUIRE(m.pass_of[k] == FsdpPass::Forward, ErrorCode::InvalidState,
                     "end_forward_only after a Backward wait_param (unit '" + m.unit_name(m.order[k]) +
                         "'): finish the iteration with grad_ready and step() instead");
  // Gathers prefetched for positions the pass did not reach: `stream` waits for them,
  // so that nothing still writes a slot or a staging half.
  for (std::size_t n = 0; n < m.order.size(); ++n) {
    if (m.prefetched[n]) m.wait_slot(m.slot_of[n], stream);
    if (m.mx_prefetched[n]) {
      const int h = m.half_of[n];
      m.wait_half(h, stream);
      m.advance_half(h, GatherState::Landed);
    }
    m.prefetched[n] = m.mx_prefetched[n] = 0;
  }
  if (!m.learned) {  // the order is learned on a training iteration
    for (auto* v : {&m.order, &m.slot_of, &m.half_of}) v->clear();
    m.pass_of.clear();
    m.needs_gather.clear();
    m.prefetched.clear();
    m.mx_prefetched.clear();
    m.next_slot = m.next_half = 0;
  }
  m.restart_iteration();
}

const std::vector<int>& Fsdp::unit_order() const {
  static const std::vector<int> none;
  return impl().learned ? impl().order : none;
}

void Fsdp::Impl::check_step_capturable() const {
  SHARDOPT_REQUIRE(learned, ErrorCode::CaptureRefused,
                   "the unit order is learned on the first iteration, which must run eagerly before capture (StepGraph "
                   "runs it as warm-up: keep StepGraphOptions::warmup_iterations >= 1)");
  state.check_capturable();
}

}  // namespace shardopt
