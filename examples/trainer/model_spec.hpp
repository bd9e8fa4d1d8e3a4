// model_spec.hpp - the parameters of the trainer's model: what is registered with the
// optimizer (names, shapes, groups, FSDP units), how each is initialised, and which
// gradient-norm group it reports under.
//
// The GPT (ModelConfig::gpt): token + position embeddings -> N blocks of [RMSNorm ->
// causal multi-head self-attention (qkv, proj)] and [RMSNorm -> MLP (up, GELU, down)] ->
// final RMSNorm -> head; no biases, no dropout, untied head.
//
// The model: token embedding -> N blocks of [RMSNorm -> dense MLP (up, SiLU, down)] and
// [RMSNorm -> router -> top-1 MoE of G experts (up, SiLU, down) with fixed capacity] ->
// final RMSNorm -> output head -> cross entropy. Each block adds its two branches to the
// residual stream.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <shardopt/fsdp.hpp>
#include <shardopt/param_spec.hpp>

#include "config.hpp"
#include "ops.hpp"

namespace trainer {

/// What a parameter is.
enum class ParamKind { Embedding, Norm, DenseUp, DenseDown, Router, ExpertUp, ExpertDown, Head, PosEmbedding, Qkv, AttnOut };

/// Gradient-norm groups (the regression test compares these between graph and eager).
/// The GPT reports its attention weights under Dense (and nothing under Router, Experts).
enum class NormGroup { Embedding, Dense, Router, Experts, Norms, Head };
inline constexpr int kNormGroups = 6;
const char* to_string(NormGroup g) noexcept;

/// One registered parameter.
struct ParamInfo {
  std::string name;
  ParamKind kind = ParamKind::Norm;
  NormGroup group = NormGroup::Norms;
  int layer = -1;         ///< block index, -1 outside blocks
  int expert = -1;        ///< the expert of a discrete expert tensor, else -1
  int members = 1;        ///< G for a grouped expert tensor
  shardopt::Shape shape;  ///< one member's shape
  int unit = 0;           ///< FSDP unit
};

/// Registration indices of one block's parameters. Expert weights: one index (a grouped
/// tensor of G members) with --experts single, G indices with --experts discrete.
struct BlockParams {
  int norm1 = -1, up = -1, down = -1, norm2 = -1, router = -1;
  int qkv = -1, proj = -1;  ///< GPT: attention in [3H, H] (q, k, v rows) and out [H, H]
  std::vector<int> expert_up, expert_down;
};

/// The parameter list of a model.
class ModelSpec {
 public:
  ModelSpec(const ModelConfig& config, bool discrete_experts);

  const ModelConfig& config() const noexcept { return config_; }
  bool discrete_experts() const noexcept { return discrete_; }
  const std::vector<ParamInfo>& params() const noexcept { return params_; }
  int num_params() const noexcept { return static_cast<int>(params_.size()); }

  int embed() const noexcept { return embed_; }
  /// The GPT's position embedding [S, H] (-1 for the MoE model).
  int pos_embed() const noexcept { return pos_embed_; }
  const std::vector<BlockParams>& blocks() const noexcept { return blocks_; }
  int final_norm() const noexcept { return final_norm_; }
  int head() const noexcept { return head_; }

  /// The specs in registration (forward) order; bf16, groups "decay" (matrices) and
  /// "no_decay" (norm weights); grouped experts name their members expert_name(...).
  /// With `muon`, the hidden matrices and experts (is_muon_kind) go to group "muon".
  std::vector<shardopt::ParamSpec> specs(bool muon = false) const;
  /// FSDP units: the embedding, one per block, the final norm with the head.
  std::vector<shardopt::FsdpUnit> units() const;
  int num_units() const noexcept { return config_.layers + 2; }

  /// How parameter i is initialised (offset 0): norm weights 1, matrices uniform with
  /// standard deviation 1/sqrt(fan_in) (down projections / sqrt(2N)), the embedding 1;
  /// keyed by the logical name, the same for single and discrete experts. The GPT:
  /// every matrix and embedding uniform with standard deviation 0.02 (the attention out
  /// and MLP down projections 0.02 / sqrt(2N)), as nanoGPT's normal init.
  InitArgs init_args(int i) const;
  /// The initial value of element j of member m (-1: not grouped) of parameter i.
  float init_value(int i, int member, std::int64_t j) const;

 private:
  int add(ParamInfo p);

  ModelConfig config_;
  bool discrete_;
  std::vector<ParamInfo> params_;
  int embed_ = -1, pos_embed_ = -1, final_norm_ = -1, head_ = -1;
  std::vector<BlockParams> blocks_;
};

/// True for the parameters --optimizer muon updates with Muon: the blocks' 2-D matrices
/// (dense up / down, router, attention qkv / out) and the experts' up / down (each expert
/// a matrix); false for the embeddings, the head and the norms (AdamW).
bool is_muon_kind(ParamKind kind) noexcept;

/// The name of expert `expert`'s up or down weight in block `layer`:
/// "layers.L.experts.G.up" / ".down". The discrete expert tensors are registered under it,
/// and it is the checkpoint name (ParamSpec::member_names) of member G of the grouped
/// tensor "layers.L.experts.up" / ".down", so both registrations read and write the same
/// checkpoints.
std::string expert_name(int layer, int expert, ParamKind kind);

/// The smallest a >= 3 coprime with vocab (the task's rule multiplier) and the offset c.
std::int64_t rule_multiplier(std::int64_t vocab);
inline constexpr std::int64_t kRuleOffset = 7;

}  // namespace trainer
