// shardopt/presets.hpp - reference parameter sets for reports, tests and benchmarks.
#pragma once

#include <cstdint>
#include <vector>

#include "shardopt/param_spec.hpp"

namespace shardopt::presets {

/// Sizes of a Llama-style decoder: token embedding, `layers` blocks of attention
/// (q, k, v, o) and gated MLP (gate, up, down) with two RMSNorm weights each, a
/// final norm and an untied output head.
struct TransformerShape {
  std::int64_t hidden = 2048;
  std::int64_t layers = 16;
  std::int64_t mlp = 8192;
  std::int64_t kv = 512;       ///< width of the k and v projections
  std::int64_t vocab = 128256;
};

/// The Llama-3.2-1B shapes above: 147 tensors, 1,498,482,688 elements.
inline constexpr TransformerShape kLlama32_1B{};

/// The parameters of such a model in registration (forward) order; matrices are in
/// group "decay", norm weights in "no_decay".
std::vector<ParamSpec> transformer(const TransformerShape& shape, DType dtype = DType::bf16);

}  // namespace shardopt::presets
