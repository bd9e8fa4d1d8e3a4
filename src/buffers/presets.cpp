#include "shardopt/presets.hpp"

#include <string>

namespace shardopt::presets {

std::vector<ParamSpec> transformer(const TransformerShape& s, DType dtype) {
  std::vector<ParamSpec> out;
  out.push_back(ParamSpec::tensor("embed.weight", {s.vocab, s.hidden}, dtype, "decay"));
  for (std::int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back(ParamSpec::tensor(p + "attn_norm.weight", {s.hidden}, dtype, "no_decay"));
    out.push_back(ParamSpec::tensor(p + "attn.q.weight", {s.hidden, s.hidden}, dtype, "decay"));
    out.push_back(ParamSpec::tensor(p + "attn.k.weight", {s.kv, s.hidden}, dtype, "decay"));
    out.push_back(ParamSpec::tensor(p + "attn.v.weight", {s.kv, s.hidden}, dtype, "decay"));
    out.push_back(ParamSpec::tensor(p + "attn.o.weight", {s.hidden, s.hidden}, dtype, "decay"));
    out.push_back(ParamSpec::tensor(p + "mlp_norm.weight", {s.hidden}, dtype, "no_decay"));
    out.push_back(ParamSpec::tensor(p + "mlp.gate.weight", {s.mlp, s.hidden}, dtype, "decay"));
    out.push_back(ParamSpec::tensor(p + "mlp.up.weight", {s.mlp, s.hidden}, dtype, "decay"));
    out.push_back(ParamSpec::tensor(p + "mlp.down.weight", {s.hidden, s.mlp}, dtype, "decay"));
  }
  out.push_back(ParamSpec::tensor("final_norm.weight", {s.hidden}, dtype, "no_decay"));
  out.push_back(ParamSpec::tensor("head.weight", {s.vocab, s.hidden}, dtype, "decay"));
  return out;
}

}  // namespace shardopt::presets
