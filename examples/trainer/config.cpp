#include "config.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace trainer {

std::int64_t ModelConfig::capacity() const {
  return static_cast<std::int64_t>(std::ceil(capacity_factor * static_cast<double>(tokens) / experts));
}

std::int64_t ModelConfig::param_count() const {
  if (gpt) {
    const std::int64_t per_layer = 2 * hidden + 4 * hidden * hidden + 2 * hidden * mlp;
    return 2 * vocab * hidden + context * hidden + hidden + layers * per_layer;
  }
  const std::int64_t per_layer = 2 * hidden                // two RMSNorm weights
                                 + 2 * hidden * mlp        // dense up and down
                                 + experts * hidden        // router
                                 + 2 * experts * hidden * expert_mlp;  // expert up and down
  return 2 * vocab * hidden + hidden + layers * per_layer;  // embedding, head, final norm
}

ModelConfig model_size(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    c = ModelConfig{64, 32, 2, 64, 4, 32, 1.25, 64};
  } else if (name == "small") {
    c = ModelConfig{4096, 256, 4, 1024, 8, 256, 1.25, 1024};
  } else if (name == "1b") {
    // Llama-3.2-1B's hidden, MLP and vocabulary sizes; 8 blocks whose MoE layers (8
    // experts of width 1024) take the place of attention: 1.06B parameters.
    c = ModelConfig{128256, 2048, 8, 8192, 8, 1024, 1.25, 8192};
  } else {
    throw std::invalid_argument("unknown --size '" + name + "' (tiny, small or 1b)");
  }
  return c;
}

ModelConfig gpt_size(const std::string& name) {
  ModelConfig c;
  c.gpt = true;
  if (name == "tiny") {
    c.vocab = 64, c.hidden = 32, c.layers = 2, c.mlp = 128, c.heads = 2, c.context = 32, c.tokens = 64;
  } else if (name == "small") {
    c.vocab = 64, c.hidden = 64, c.layers = 2, c.mlp = 256, c.heads = 4, c.context = 64, c.tokens = 256;
  } else if (name == "baby") {
    c.vocab = 64, c.hidden = 384, c.layers = 6, c.mlp = 1536, c.heads = 6, c.context = 256, c.tokens = 64 * 256;
  } else {
    throw std::invalid_argument("unknown --size '" + name + "' for --model gpt (tiny, small or baby)");
  }
  return c;
}

void validate(const ModelConfig& c) {
  if (c.gpt) {
    if (c.vocab < 2 || c.vocab > 256 || c.hidden < 1 || c.layers < 1 || c.mlp < 1 || c.heads < 1 ||
        c.hidden % c.heads != 0 || c.context < 1 || c.tokens < c.context || c.tokens % c.context != 0)
      throw std::invalid_argument("GPT sizes: vocab 2..256, positive sizes, hidden a multiple of --heads, tokens a "
                                  "multiple of --context");
    return;
  }
  if (c.vocab < 2 || c.hidden < 1 || c.layers < 1 || c.mlp < 1 || c.experts < 1 || c.expert_mlp < 1 ||
      c.tokens < 1 || !(c.capacity_factor > 0.0))
    throw std::invalid_argument("every model size must be positive (vocab >= 2)");
  if (c.experts > kMaxExperts)
    throw std::invalid_argument("at most " + std::to_string(kMaxExperts) + " experts");
  if (c.capacity() < 1) throw std::invalid_argument("the expert capacity must be at least 1 token");
}

std::string checkpoint_dir(const std::string& save_dir, std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%05lld", static_cast<long long>(step));
  std::string dir = save_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir + "/" + name;
}

}  // namespace trainer
