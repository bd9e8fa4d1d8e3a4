#include "config.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
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

namespace {

bool parse_bool(const std::string& opt, const std::string& v) {
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  throw std::invalid_argument(opt + " takes on or off, not '" + v + "'");
}

long long parse_int(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') throw std::invalid_argument(opt + " takes an integer, not '" + v + "'");
  return x;
}

double parse_real(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') throw std::invalid_argument(opt + " takes a number, not '" + v + "'");
  return x;
}

void one_of(const std::string& opt, const std::string& v, std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  throw std::invalid_argument(opt + " takes one of " + list + ", not '" + v + "'");
}

}  // namespace

TrainOptions parse_options(const std::vector<std::string>& args) {
  TrainOptions o;
  std::vector<std::pair<std::string, std::string>> overrides;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string opt = args[i], val;
    const auto eq = opt.find('=');
    if (eq != std::string::npos) {
      val = opt.substr(eq + 1);
      opt = opt.substr(0, eq);
    } else if (opt == "--quiet") {
      o.quiet = true;
      continue;
    } else {
      if (i + 1 >= args.size()) throw std::invalid_argument(opt + " needs a value");
      val = args[++i];
    }
    if (opt == "--size") {
      one_of(opt, val, {"tiny", "small", "1b", "baby"});
      o.size = val;
    } else if (opt == "--model") {
      one_of(opt, val, {"moe", "gpt"});
      o.model_kind = val;
    } else if (opt == "--task") {
      one_of(opt, val, {"synthetic", "shakespeare"});
      o.task = val;
    } else if (opt == "--data") {
      if (val.empty()) throw std::invalid_argument("--data needs a directory");
      o.data_dir = val;
    } else if (opt == "--eval-every") {
      o.eval_every = static_cast<int>(parse_int(opt, val));
      if (o.eval_every < 0) throw std::invalid_argument("--eval-every takes steps >= 0");
    } else if (opt == "--eval-batches") {
      o.eval_batches = static_cast<int>(parse_int(opt, val));
      if (o.eval_batches < 1) throw std::invalid_argument("--eval-batches takes at least 1");
    } else if (opt == "--sample") {
      o.sample_chars = static_cast<int>(parse_int(opt, val));
      if (o.sample_chars < 0) throw std::invalid_argument("--sample takes characters >= 0");
    } else if (opt == "--mode") {
      one_of(opt, val, {"dist-adam", "fsdp"});
      o.mode = val;
    } else if (opt == "--optimizer") {
      one_of(opt, val, {"adamw", "muon"});
      o.optimizer = val;
    } else if (opt == "--params") {
      one_of(opt, val, {"bf16", "mxfp8", "nvfp4"});
      o.params = val;
    } else if (opt == "--grad-dtype") {
      one_of(opt, val, {"bf16", "fp32"});
      o.grad_dtype = val;
    } else if (opt == "--master") {
      one_of(opt, val, {"fp32", "remainder"});
      o.master = val;
    } else if (opt == "--moments") {
      one_of(opt, val, {"fp32", "bf16"});
      o.moments = val;
    } else if (opt == "--experts") {
      one_of(opt, val, {"single", "discrete"});
      o.experts = val;
    } else if (opt == "--graph") {
      o.graph = parse_bool(opt, val);
    } else if (opt == "--microbatches") {
      o.microbatches = static_cast<int>(parse_int(opt, val));
    } else if (opt == "--steps") {
      o.steps = static_cast<int>(parse_int(opt, val));
    } else if (opt == "--lr") {
      o.lr = static_cast<float>(parse_real(opt, val));
    } else if (opt == "--warmup-steps") {
      o.warmup_steps = static_cast<int>(parse_int(opt, val));
    } else if (opt == "--clip") {
      o.clip = static_cast<float>(parse_real(opt, val));
    } else if (opt == "--weight-decay") {
      o.weight_decay = static_cast<float>(parse_real(opt, val));
    } else if (opt == "--seed") {
      o.seed = static_cast<std::uint64_t>(parse_int(opt, val));
    } else if (opt == "--log-every") {
      o.log_every = static_cast<int>(parse_int(opt, val));
    } else if (opt == "--group-norms") {
      o.group_norms = parse_bool(opt, val);
    } else if (opt == "--backend") {
      one_of(opt, val, {"auto", "cuda", "host"});
      o.backend = val;
    } else if (opt == "--save-dir") {
      if (val.empty()) throw std::invalid_argument("--save-dir needs a directory");
      o.save_dir = val;
    } else if (opt == "--save-every") {
      const long long k = parse_int(opt, val);
      if (k < 1) throw std::invalid_argument("--save-every takes a number of steps of at least 1, not '" + val + "'");
      if (k > 1000000000) throw std::invalid_argument("--save-every " + val + " is too large");
      o.save_every = static_cast<int>(k);
    } else if (opt == "--resume") {
      if (val.empty()) throw std::invalid_argument("--resume needs a checkpoint directory");
      o.resume = val;
    } else if (opt == "--timeout-ms") {
      const long long ms = parse_int(opt, val);
      if (ms < 0) throw std::invalid_argument("--timeout-ms takes milliseconds >= 0 (0: off), not '" + val + "'");
      o.timeout_ms = ms;
    } else if (opt == "--vocab" || opt == "--hidden" || opt == "--layers" || opt == "--mlp" ||
               opt == "--num-experts" || opt == "--expert-mlp" || opt == "--tokens" || opt == "--capacity-factor" ||
               opt == "--heads" || opt == "--context") {
      overrides.emplace_back(opt, val);
    } else {
      throw std::invalid_argument("unknown option '" + opt + "' (see --help)");
    }
  }
  o.model = o.model_kind == "gpt" ? gpt_size(o.size) : model_size(o.size);
  for (const auto& [opt, val] : overrides) {
    if (opt == "--capacity-factor") {
      o.model.capacity_factor = parse_real(opt, val);
      continue;
    }
    const long long x = parse_int(opt, val);
    if (opt == "--vocab") o.model.vocab = x;
    if (opt == "--hidden") o.model.hidden = x;
    if (opt == "--layers") o.model.layers = static_cast<int>(x);
    if (opt == "--mlp") o.model.mlp = x;
    if (opt == "--num-experts") o.model.experts = static_cast<int>(x);
    if (opt == "--expert-mlp") o.model.expert_mlp = x;
    if (opt == "--tokens") o.model.tokens = x;
    if (opt == "--heads") o.model.heads = static_cast<int>(x);
    if (opt == "--context") o.model.context = x;
  }
  validate(o.model);
  if (o.microbatches < 1) throw std::invalid_argument("--microbatches must be at least 1");
  if (o.steps < 1) throw std::invalid_argument("--steps must be at least 1");
  if (o.save_every > 0 && o.save_dir.empty())
    throw std::invalid_argument("--save-every needs --save-dir (where to write the checkpoints)");
  return o;
}

std::string checkpoint_dir(const std::string& save_dir, std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%05lld", static_cast<long long>(step));
  std::string dir = save_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir + "/" + name;
}

std::string usage() {
  std::ostringstream s;
  s << "usage: trainer [options]   (one rank per GPU under mpirun; the host backend without GPUs)\n"
       "  --size tiny|small|1b          model size (default tiny)\n"
       "  --model moe|gpt               the MLP + MoE model (default) or a GPT (attention + MLP blocks;\n"
       "                                sizes tiny|small|baby)\n"
       "  --task synthetic|shakespeare  the rule on random tokens (default) or characters of Shakespeare's\n"
       "                                works (--data DIR, default data/shakespeare: tools/shakespeare_data.py)\n"
       "  --eval-every K                validation loss every K steps on --eval-batches N fixed batches\n"
       "                                (default 4; shakespeare: also after the last step)\n"
       "  --sample N                    N characters of generated text at the end (shakespeare)\n"
       "  --mode dist-adam|fsdp         distributed Adam (ZeRO-1/2) or FSDP (ZeRO-3)\n"
       "  --optimizer adamw|muon        adamw (default): AdamW for every parameter; muon: Muon for the\n"
       "                                hidden 2-D matrices (attention, MLP, router) and each MoE expert,\n"
       "                                AdamW for the embeddings, head and norms (same lr: Muon's\n"
       "                                match_rms_adamw scaling; --weight-decay for both; --params bf16;\n"
       "                                the host backend so far)\n"
       "  --params bf16|mxfp8|nvfp4     parameter format (mxfp8 / nvfp4: 2-D weights stored as MXFP8 /\n"
       "                                NVFP4, decoded to bf16 for the GEMMs; --mode dist-adam only)\n"
       "  --grad-dtype fp32|bf16        gradient buffer dtype\n"
       "  --master fp32|remainder       the optimizer's master: an fp32 copy, or the bf16 parameter + a 16-bit\n"
       "                                remainder (exact, 2 bytes less per parameter; docs/state_precision.md)\n"
       "  --moments fp32|bf16           dtype of the Adam moments\n"
       "  --experts single|discrete     one grouped tensor per MoE weight, or G tensors\n"
       "  --graph on|off                capture the whole iteration in one graph\n"
       "  --microbatches K  --steps S   (defaults 2, 100)\n"
       "  --lr X  --warmup-steps W  --clip X  --weight-decay X  --seed N\n"
       "  --log-every K                 a progress line every K steps (default: ~20 lines)\n"
       "  --group-norms on|off          per-group gradient norms on the device (default on)\n"
       "  --backend auto|cuda|host      (auto: cuda when built with CUDA and a GPU is visible)\n"
       "  --save-dir DIR                save checkpoints into DIR/step-NNNNN (the step, zero-padded to\n"
       "                                5 digits): after the last step, and every K steps with --save-every\n"
       "  --save-every K                also save after every K-th step (K >= 1; needs --save-dir)\n"
       "  --resume CKPT                 load the checkpoint directory CKPT (e.g. DIR/step-00010) before\n"
       "                                training and continue from its step: --steps is the total to reach\n"
       "  --timeout-ms MS               a collective, wait or replayed step slower than MS ms (a dead or\n"
       "                                stuck rank) stops every live rank with a timeout error (0: off;\n"
       "                                default: replays 5 minutes, waits unbounded)\n"
       "  --quiet                       only the summary\n"
       "  --expect-loss-below X         exit 1 unless the last logged loss is below X\n"
       "  --expect-val-loss-below X     exit 1 unless the final validation loss is below X\n"
       "  --save-init DIR               save the initial weights (a checkpoint of step 0) into DIR\n"
       "  --metrics FILE                rank 0 writes every step's loss, grad norm, lr, step time and\n"
       "                                tokens/s to FILE as JSON lines\n"
       "  size overrides: --vocab --hidden --layers --mlp --num-experts --expert-mlp --tokens\n"
       "                  --capacity-factor; gpt: --heads --context\n";
  return s.str();
}

}  // namespace trainer
