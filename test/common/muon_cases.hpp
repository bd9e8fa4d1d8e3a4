// muon_cases.hpp - the distributed Muon test cases (issue 34, docs/muon.md), written
// once for a backend: the host backend under mpiexec (CI) runs them today.
//
// The model mixes AdamW parameters with Muon matrices: a 2-D matrix taller than wide
// (Newton-Schulz on its transpose), one wider than tall, and a grouped parameter of three
// equal 8 x 48 experts in a second Muon group with other settings (no Nesterov,
// match_rms_adamw, lr_scale 0.5). Small buckets, so that matrices are cut across ranks.
// Gradients: rank 0 writes the values, the others zeros, reduced with Sum: the reduced
// gradient is exactly rank 0's on any world size, so results can be compared bitwise
// across world sizes and against a world of one.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "dist_adam_cases.hpp"
#include "muon_oracle.hpp"
#include "shardopt/fsdp.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/muon.hpp"

namespace shardopt::test::muon {

inline std::vector<ParamSpec> model() {
  return {
      ParamSpec::tensor("embed", {20, 8}, DType::bf16, "adam"),
      ParamSpec::tensor("wq", {24, 16}, DType::bf16, "muon"),
      ParamSpec::tensor("norm", {16}, DType::bf16, "adam"),
      ParamSpec::tensor("wo", {16, 40}, DType::bf16, "muon"),
      ParamSpec::grouped("experts", 3, {8, 48}, DType::bf16, "muon_x"),
  };
}
/// Fsdp units of model(): embed; wq + norm; wo; experts.
inline std::vector<FsdpUnit> units() { return {{"embed", 0, 1}, {"attn", 1, 2}, {"wo", 3, 1}, {"experts", 4, 1}}; }

inline AdamGroup muon_group(bool nesterov, MuonLrAdjust adjust, double momentum, double wd, double lr_scale) {
  AdamGroup g;
  g.algorithm = GroupAlgorithm::Muon;
  g.lr_scale = lr_scale;
  g.muon.nesterov = nesterov;
  g.muon.adjust_lr = adjust;
  g.muon.momentum = momentum;
  g.muon.weight_decay = wd;
  return g;
}

inline void set_groups(AdamOptions& o) {
  o.groups["adam"] = AdamGroup{0.01, 1.0};
  o.groups["muon"] = muon_group(true, MuonLrAdjust::Original, 0.95, 0.1, 1.0);
  o.groups["muon_x"] = muon_group(false, MuonLrAdjust::MatchRmsAdamW, 0.9, 0.05, 0.5);
}

inline DistributedAdamOptions dist_options() {
  DistributedAdamOptions o;
  o.grad_dtype = DType::f32;
  o.grad_reduce = ReduceOp::Sum;
  o.bucket_numel = 200;
  set_groups(o);
  return o;
}

inline FsdpOptions fsdp_options() {
  FsdpOptions o;
  o.param_dtype = DType::bf16;
  o.grad_dtype = DType::f32;
  o.slot_grad_dtype = DType::f32;
  o.grad_reduce = ReduceOp::Sum;
  o.bucket_numel = 200;
  set_groups(o);
  return o;
}

constexpr float kLr = 0.02f;

/// Writes value(-1, i, .) into this rank's master pieces and publishes them.
template <class Opt>
void init(Opt& opt, Stream s) {
  for (int i = 0; i < opt.num_params(); ++i) {
    const ShardView v = opt.shard_master(i);
    std::vector<float> x(static_cast<std::size_t>(v.numel()));
    for (std::size_t j = 0; j < x.size(); ++j) x[j] = value(-1, i, v.param_offset + static_cast<std::int64_t>(j));
    from_host(opt.backend(), v.data, x);
  }
  opt.init_from_master(s);
}

/// The full gradient of param i at `step` (rank 0's; zeros on other ranks unless `all`).
inline std::vector<float> grad_values(int step, int i, std::int64_t n, bool mine) {
  std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
  if (mine)
    for (std::int64_t j = 0; j < n; ++j) g[static_cast<std::size_t>(j)] = value(step, i, j);
  return g;
}

/// A StepGraph iteration body for `opt`: enqueues the writing of the gradients of the
/// device step counter's step (rank 0's values, zeros elsewhere), read when the (recorded)
/// work runs, so a replay writes each step's own gradients.
inline std::function<void(Stream, bool)> graph_microbatch(DistributedAdam& opt) {
  return [&opt](Stream st, bool) {
    const bool mine = opt.comm().rank() == 0;
    std::vector<GradView> gs;
    for (int i = 0; i < opt.num_params(); ++i) gs.push_back(opt.grad(i));
    const StepScalars* sc = opt.device_scalars();
    host_enqueue(st, [gs, sc, mine] {
      for (std::size_t i = 0; i < gs.size(); ++i) {
        const auto g = grad_values(static_cast<int>(sc->step), static_cast<int>(i), gs[i].numel(), mine);
        std::memcpy(gs[i].data, g.data(), g.size() * sizeof(float));
      }
    });
  };
}

/// One DistributedAdam step with the gradients of `step` (rank 0 only unless `every_rank`).
inline void dist_step(DistributedAdam& opt, int step, Stream s, bool every_rank = false) {
  const bool mine = every_rank || opt.comm().rank() == 0;
  for (int i = 0; i < opt.num_params(); ++i) {
    const GradView g = opt.grad(i);
    const std::vector<float> v = grad_values(step, i, g.numel(), mine);
    if (g.dtype == DType::bf16) {
      std::vector<std::uint16_t> codes(v.size());
      for (std::size_t j = 0; j < v.size(); ++j) codes[j] = num::f32_to_bf16(v[j]);
      from_host(opt.backend(), g.data, codes);
    } else {
      from_host(opt.backend(), g.data, v);
    }
  }
  opt.step(s);
  opt.zero_grad(s);
  opt.synchronize(s);
}

/// One Fsdp iteration (gathers, gradients into the slots, reduce, step) with `step`'s gradients.
inline void fsdp_step(Fsdp& f, int step, Stream s) {
  const bool mine = world_rank() == 0;
  const auto us = units();
  const int nu = static_cast<int>(us.size());
  for (int u = 0; u < nu; ++u) (void)f.wait_param(u, s);
  for (int u = nu - 1; u >= 0; --u) {
    (void)f.wait_param(u, s);
    const auto grads = f.grad_slot(u, s);
    for (int k = 0; k < us[static_cast<std::size_t>(u)].count; ++k) {
      const GradView& g = grads[static_cast<std::size_t>(k)];
      from_host(f.backend(), g.data, grad_values(step, us[static_cast<std::size_t>(u)].first + k, g.numel(), mine));
    }
    f.grad_ready(u, s);
  }
  f.step(s);
  f.zero_grad(s);
  f.synchronize(s);
}

}  // namespace shardopt::test::muon
