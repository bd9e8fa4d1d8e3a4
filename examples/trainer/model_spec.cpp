#include "model_spec.hpp"

#include <cmath>
#include <numeric>

#include "op_math.hpp"

namespace trainer {

const char* to_string(NormGroup g) noexcept {
  switch (g) {
    case NormGroup::Embedding: return "embedding";
    case NormGroup::Dense: return "dense";
    case NormGroup::Router: return "router";
    case NormGroup::Experts: return "experts";
    case NormGroup::Norms: return "norms";
    case NormGroup::Head: return "head";
  }
  return "?";
}

std::int64_t rule_multiplier(std::int64_t vocab) {
  std::int64_t a = 5;
  while (std::gcd(a, vocab) != 1) ++a;
  return a;
}

std::string expert_name(int layer, int expert, ParamKind kind) {
  return "layers." + std::to_string(layer) + ".experts." + std::to_string(expert) +
         (kind == ParamKind::ExpertUp ? ".up" : ".down");
}

int ModelSpec::add(ParamInfo p) {
  params_.push_back(std::move(p));
  return static_cast<int>(params_.size()) - 1;
}

ModelSpec::ModelSpec(const ModelConfig& c, bool discrete) : config_(c), discrete_(discrete && !c.gpt) {
  validate(c);
  const std::int64_t H = c.hidden, F = c.mlp, V = c.vocab, E = c.expert_mlp;
  const int G = c.experts;
  embed_ = add({"embed", ParamKind::Embedding, NormGroup::Embedding, -1, -1, 1, {V, H}, 0});
  if (c.gpt) {
    pos_embed_ = add({"pos_embed", ParamKind::PosEmbedding, NormGroup::Embedding, -1, -1, 1, {c.context, H}, 0});
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      const int unit = l + 1;
      BlockParams b;
      b.norm1 = add({p + "norm1", ParamKind::Norm, NormGroup::Norms, l, -1, 1, {H}, unit});
      b.qkv = add({p + "attn.qkv", ParamKind::Qkv, NormGroup::Dense, l, -1, 1, {3 * H, H}, unit});
      b.proj = add({p + "attn.proj", ParamKind::AttnOut, NormGroup::Dense, l, -1, 1, {H, H}, unit});
      b.norm2 = add({p + "norm2", ParamKind::Norm, NormGroup::Norms, l, -1, 1, {H}, unit});
      b.up = add({p + "mlp.up", ParamKind::DenseUp, NormGroup::Dense, l, -1, 1, {F, H}, unit});
      b.down = add({p + "mlp.down", ParamKind::DenseDown, NormGroup::Dense, l, -1, 1, {H, F}, unit});
      blocks_.push_back(b);
    }
    final_norm_ = add({"final_norm", ParamKind::Norm, NormGroup::Norms, -1, -1, 1, {H}, c.layers + 1});
    head_ = add({"head", ParamKind::Head, NormGroup::Head, -1, -1, 1, {V, H}, c.layers + 1});
    return;
  }
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const int unit = l + 1;
    BlockParams b;
    b.norm1 = add({p + "norm1", ParamKind::Norm, NormGroup::Norms, l, -1, 1, {H}, unit});
    b.up = add({p + "mlp.up", ParamKind::DenseUp, NormGroup::Dense, l, -1, 1, {F, H}, unit});
    b.down = add({p + "mlp.down", ParamKind::DenseDown, NormGroup::Dense, l, -1, 1, {H, F}, unit});
    b.norm2 = add({p + "norm2", ParamKind::Norm, NormGroup::Norms, l, -1, 1, {H}, unit});
    b.router = add({p + "router", ParamKind::Router, NormGroup::Router, l, -1, 1, {G, H}, unit});
    if (discrete) {
      for (int g = 0; g < G; ++g)
        b.expert_up.push_back(add({expert_name(l, g, ParamKind::ExpertUp), ParamKind::ExpertUp, NormGroup::Experts, l,
                                   g, 1, {E, H}, unit}));
      for (int g = 0; g < G; ++g)
        b.expert_down.push_back(add({expert_name(l, g, ParamKind::ExpertDown), ParamKind::ExpertDown,
                                     NormGroup::Experts, l, g, 1, {H, E}, unit}));
    } else {
      b.expert_up.push_back(add({p + "experts.up", ParamKind::ExpertUp, NormGroup::Experts, l, -1, G, {E, H}, unit}));
      b.expert_down.push_back(
          add({p + "experts.down", ParamKind::ExpertDown, NormGroup::Experts, l, -1, G, {H, E}, unit}));
    }
    blocks_.push_back(b);
  }
  final_norm_ = add({"final_norm", ParamKind::Norm, NormGroup::Norms, -1, -1, 1, {H}, c.layers + 1});
  head_ = add({"head", ParamKind::Head, NormGroup::Head, -1, -1, 1, {V, H}, c.layers + 1});
}

bool is_muon_kind(ParamKind kind) noexcept {
  switch (kind) {
    case ParamKind::DenseUp:
    case ParamKind::DenseDown:
    case ParamKind::Router:
    case ParamKind::ExpertUp:
    case ParamKind::ExpertDown:
    case ParamKind::Qkv:
    case ParamKind::AttnOut: return true;
    case ParamKind::Embedding:
    case ParamKind::PosEmbedding:
    case ParamKind::Norm:
    case ParamKind::Head: return false;
  }
  return false;
}

std::vector<shardopt::ParamSpec> ModelSpec::specs(bool muon) const {
  std::vector<shardopt::ParamSpec> out;
  for (const ParamInfo& p : params_) {
    const std::string group =
        muon && is_muon_kind(p.kind) ? "muon" : (p.kind == ParamKind::Norm ? "no_decay" : "decay");
    if (p.members > 1) {
      out.push_back(shardopt::ParamSpec::grouped(p.name, p.members, p.shape, shardopt::DType::bf16, group));
      // Checkpoint names of the members: the discrete experts' names, so that --experts
      // single and --experts discrete load each other's checkpoints.
      for (int m = 0; m < p.members; ++m) out.back().member_names.push_back(expert_name(p.layer, m, p.kind));
    } else {
      out.push_back(shardopt::ParamSpec::tensor(p.name, p.shape, shardopt::DType::bf16, group));
    }
  }
  return out;
}

std::vector<shardopt::FsdpUnit> ModelSpec::units() const {
  std::vector<shardopt::FsdpUnit> units(static_cast<std::size_t>(num_units()));
  for (int u = 0; u < num_units(); ++u) {
    units[static_cast<std::size_t>(u)].name =
        u == 0 ? "embed" : (u == num_units() - 1 ? "final" : "layers." + std::to_string(u - 1));
    units[static_cast<std::size_t>(u)].first = -1;
  }
  for (int i = 0; i < num_params(); ++i) {
    auto& unit = units[static_cast<std::size_t>(params_[static_cast<std::size_t>(i)].unit)];
    if (unit.first < 0) unit.first = i;
    ++unit.count;
  }
  return units;
}

InitArgs ModelSpec::init_args(int i) const {
  const ParamInfo& p = params_.at(static_cast<std::size_t>(i));
  InitArgs a;
  a.member_numel = shardopt::numel(p.shape);
  if (p.kind == ParamKind::Norm) {
    a.is_constant = true;
    a.constant = 1.0f;
    return a;
  }
  // The key of a tensor is a hash of its logical name: discrete expert g and member g of
  // the grouped tensor share it, so both registrations start from the same values.
  for (int m = 0; m < p.members; ++m) {
    std::string logical = p.name;
    if (p.kind == ParamKind::ExpertUp || p.kind == ParamKind::ExpertDown)
      logical = expert_name(p.layer, p.expert >= 0 ? p.expert : m, p.kind);
    std::uint64_t h = 0xC0FFEEull;
    for (char ch : logical) h = math::mix(h ^ static_cast<unsigned char>(ch));
    a.keys[static_cast<std::size_t>(m)] = h;
  }
  if (config_.gpt) {
    double sd = 0.02;
    if (p.kind == ParamKind::AttnOut || p.kind == ParamKind::DenseDown) sd /= std::sqrt(2.0 * config_.layers);
    a.bound = static_cast<float>(std::sqrt(3.0) * sd);
    return a;
  }
  const double fan_in = static_cast<double>(p.shape.back());
  double stddev = 1.0 / std::sqrt(fan_in);
  if (p.kind == ParamKind::Embedding) stddev = 1.0;
  if (p.kind == ParamKind::DenseDown || p.kind == ParamKind::ExpertDown) stddev /= std::sqrt(2.0 * config_.layers);
  a.bound = static_cast<float>(std::sqrt(3.0) * stddev);  // uniform with this standard deviation
  return a;
}

float ModelSpec::init_value(int i, int member, std::int64_t j) const {
  const InitArgs a = init_args(i);
  if (a.is_constant) return a.constant;
  return math::init_uniform(a.keys[static_cast<std::size_t>(member < 0 ? 0 : member)], j, a.bound);
}

}  // namespace trainer
