// config.hpp - the sizes of the trainer's model and the options of a training run.
//
// The model is generic in its sizes: vocabulary V, hidden H, layers N, dense MLP width F,
// experts G, expert width Fe, capacity factor, and tokens per microbatch T (per rank).
// Every shape is static for a run, which is what lets one CUDA graph serve every step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

/// Sizes of the model (see model.hpp for what each is).
struct ModelConfig {
  std::int64_t vocab = 64;          ///< V
  std::int64_t hidden = 32;         ///< H
  int layers = 2;                   ///< N blocks of [RMSNorm -> MLP] and [RMSNorm -> router -> MoE]
  std::int64_t mlp = 64;            ///< F, dense MLP width
  int experts = 4;                  ///< G
  std::int64_t expert_mlp = 32;     ///< Fe, width of one expert's MLP
  double capacity_factor = 1.25;    ///< capacity C = ceil(capacity_factor * T / G)
  std::int64_t tokens = 64;         ///< T, tokens per microbatch per rank
  /// The GPT instead (--model gpt): token and position embeddings, N blocks of [RMSNorm ->
  /// causal multi-head self-attention] and [RMSNorm -> MLP (up, GELU, down)], RMSNorm,
  /// head; T = sequences * context. The expert sizes are unused.
  bool gpt = false;
  int heads = 1;                    ///< attention heads (hidden % heads == 0)
  std::int64_t context = 0;         ///< S, the sequence length (T % S == 0)

  /// Tokens each expert can take per microbatch (the rest are dropped: padding instead).
  std::int64_t capacity() const;
  /// Number of model parameters (elements), for reports.
  std::int64_t param_count() const;
};

/// Largest number of experts (pointer arrays of the batched GEMMs are this long).
inline constexpr int kMaxExperts = 64;

/// The named sizes: "tiny" (host, seconds), "small" (GPU, seconds), "1b" (about 1B
/// parameters with Llama-3.2-1B's hidden, MLP and vocabulary sizes). Throws
/// std::invalid_argument for an unknown name.
ModelConfig model_size(const std::string& name);

/// The GPT sizes (--model gpt): "tiny" (tests, seconds on the host), "small" (the host's
/// main run, minutes on 2 cores), "baby" (nanoGPT's character-level baby GPT: 6 layers,
/// 6 heads, width 384, context 256, 64 sequences per microbatch). The vocabulary is the
/// data's (a placeholder until then). Throws std::invalid_argument for an unknown name.
ModelConfig gpt_size(const std::string& name);

/// Checks a config (positive sizes, G <= kMaxExperts); throws std::invalid_argument.
void validate(const ModelConfig& c);

/// Options of a training run (the command line of the trainer).
struct TrainOptions {
  std::string size = "tiny";
  std::string model_kind = "moe";    ///< --model: moe (MLP + MoE blocks) | gpt (attention + MLP blocks)
  std::string task = "synthetic";    ///< synthetic (the rule on random tokens) | shakespeare (text)
  std::string data_dir = "data/shakespeare";  ///< --task shakespeare: tools/shakespeare_data.py's output
  int eval_every = 0;                ///< validation loss every K steps (0: only at the end with --task shakespeare)
  int eval_batches = 4;              ///< fixed validation batches per evaluation (per rank)
  int sample_chars = 0;              ///< characters of generated text at the end (--task shakespeare)
  std::string mode = "dist-adam";    ///< dist-adam | fsdp
  /// --optimizer: adamw (every parameter) | muon (Muon for the hidden 2-D matrices and the
  /// MoE experts, AdamW for the embeddings, head and norms; ModelSpec::specs).
  std::string optimizer = "adamw";
  std::string params = "bf16";       ///< bf16 | mxfp8 | nvfp4 (quantized weights; dist-adam only)
  std::string grad_dtype = "fp32";   ///< fp32 | bf16
  /// --master: fp32 (an fp32 master copy) | remainder (bf16 parameters + 16-bit remainders,
  /// MasterStorage::bf16_remainder; docs/state_precision.md)
  std::string master = "fp32";
  std::string moments = "fp32";      ///< --moments: fp32 | bf16 (AdamOptions::moment_dtype)
  /// --offload: share of the optimizer state kept in pinned host memory, in [0, 1]
  /// (AdamOptions::offload_fraction; docs/offload.md)
  double offload = 0.0;
  std::string experts = "single";    ///< single (one grouped tensor) | discrete (G tensors)
  bool graph = true;                 ///< capture the iteration in one graph after warm-up
  int microbatches = 2;
  int steps = 100;
  float lr = -1.0f;                  ///< peak learning rate; < 0: the size's default
  float min_lr_ratio = 0.1f;         ///< cosine decays to lr * this
  int warmup_steps = -1;             ///< < 0: steps / 10
  float clip = 1.0f;                 ///< global-norm clipping (0: off)
  float weight_decay = 0.01f;
  std::uint64_t seed = 1234;
  int log_every = 0;                 ///< 0: about 20 lines per run
  bool group_norms = true;           ///< per-group gradient norms on the device each step
  std::string backend = "auto";      ///< auto | cuda | host
  ModelConfig model;                 ///< filled from `size` (overrides below apply after)
  bool quiet = false;                ///< no per-step lines (tests)
  /// Checkpoints (Trainer::save): with a directory, the program saves into
  /// save_dir/step-NNNNN (checkpoint_dir) after every save_every-th step and after the last.
  std::string save_dir;
  int save_every = 0;                ///< 0: only after the last step
  /// A checkpoint directory to load before training (Trainer::load); training continues
  /// at its step, up to `steps` in all.
  std::string resume;
  /// The watchdog (shardopt/watchdog.hpp): a blocking wait or a replayed step that takes
  /// longer than this many milliseconds raises Error(Timeout) on every live rank.
  /// -1: the library's defaults (waits unbounded, replays 5 minutes); 0: off.
  long long timeout_ms = -1;
};

/// Where the program saves the checkpoint of step `step`: DIR/step-NNNNN (at least 5
/// digits, zero-padded, so that the names sort by step).
std::string checkpoint_dir(const std::string& save_dir, std::int64_t step);

/// The program's options beyond the training run (main.cpp): the files it writes besides
/// checkpoints, and the checks of its exit code.
struct ProgramOptions {
  std::string metrics_path;              ///< --metrics FILE: rank 0 writes one JSON line per step
  std::string save_init;                 ///< --save-init DIR: the initial weights as a checkpoint of step 0
  double expect_loss_below = -1.0;       ///< --expect-loss-below X: exit 1 unless the last loss is below (< 0: off)
  double expect_val_loss_below = -1.0;   ///< --expect-val-loss-below X: the same for the final validation loss
};

/// The program's whole command line.
struct CommandLine {
  TrainOptions train;
  ProgramOptions program;
  bool help = false;  ///< --help / -h was given: print usage() and do nothing else
};

// The command line (cli.cpp, with CLI11). Bad input throws std::invalid_argument with a
// message naming the option. Size overrides (--vocab --hidden --layers --mlp --num-experts
// --expert-mlp --tokens --capacity-factor --heads --context) apply to the named size.

/// Parses the program's command line (argv[1..]).
CommandLine parse_command_line(const std::vector<std::string>& args);

/// Parses the options of a training run only (tests, the benchmark): the program's own
/// options (--metrics ...) are unknown here.
TrainOptions parse_options(const std::vector<std::string>& args);

/// The --help text of the trainer (CLI11's, from the options' declarations).
std::string usage();

}  // namespace trainer
