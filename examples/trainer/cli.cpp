// cli.cpp - the trainer's command line, parsed with CLI11: every option, its default, its
// checks and its line of --help are declared once, in add_options.
//
// Each option's value goes through the trainer's own conversions (the helpers below), so
// bad input is a std::invalid_argument whose message names the option ("--steps takes an
// integer, not 'ten'"); CLI11's own errors (a missing value, an unknown option) are turned
// into the same exception by parse().
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "config.hpp"
#include "state_precision.hpp"

namespace trainer {

namespace {

// ---------------------------------------------------------------- values

bool parse_bool(const std::string& opt, const std::string& v) {
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  throw std::invalid_argument(opt + " takes on or off, not '" + v + "'");
}

long long parse_int(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') throw std::invalid_argument(opt + " takes an integer, not '" + v + "'");
  if (errno == ERANGE) throw std::invalid_argument(opt + " " + v + " is out of range");
  return x;
}

/// parse_int, for a field of type T: an int option refuses what an int cannot hold (a
/// 64-bit field, --seed, takes any integer, a negative one modulo 2^64).
template <class T>
T parse_int_as(const std::string& opt, const std::string& v) {
  const long long x = parse_int(opt, v);
  if constexpr (sizeof(T) < sizeof(long long)) {
    if (x < static_cast<long long>(std::numeric_limits<T>::min()) ||
        x > static_cast<long long>(std::numeric_limits<T>::max()))
      throw std::invalid_argument(opt + " " + v + " is out of range");
  }
  return static_cast<T>(x);
}

double parse_real(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') throw std::invalid_argument(opt + " takes a number, not '" + v + "'");
  return x;
}

std::string joined(const std::vector<std::string>& names, const char* sep) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : sep) + n;
  return s;
}

void one_of(const std::string& opt, const std::string& v, const std::vector<std::string>& allowed) {
  for (const std::string& a : allowed)
    if (v == a) return;
  throw std::invalid_argument(opt + " takes one of " + joined(allowed, ", ") + ", not '" + v + "'");
}

template <class T, std::size_t N>
std::vector<std::string> names_of(const Choice<T> (&table)[N]) {
  std::vector<std::string> names;
  for (const Choice<T>& c : table) names.emplace_back(c.name);
  return names;
}

/// The help of a choice table: one line per choice.
template <class T, std::size_t N>
std::string help_of(const Choice<T> (&table)[N], const std::string& first_line) {
  std::string s = first_line;
  for (const Choice<T>& c : table) s += "\n  " + std::string(c.name) + ": " + c.help;
  return s;
}

// ---------------------------------------------------------------- option kinds

/// Declares options on a CLI::App; every kind takes the option's value as text and converts
/// it with the helpers above (their messages are the trainer's).
class Declare {
 public:
  explicit Declare(CLI::App& app) : app_(app) {}

  void group(const std::string& name) { group_ = name; }

  /// A value from `allowed` (the type shown is the list: "dist-adam|fsdp").
  CLI::Option* choice(const std::string& name, std::string& field, std::vector<std::string> allowed,
                      const std::string& help) {
    const std::string shown = joined(allowed, "|");
    return add(name, help, shown, field, [&field, name, allowed](const std::string& v) {
      one_of(name, v, allowed);
      field = v;
    });
  }

  /// A non-empty text; `if_empty` is the message for an empty one ("--data needs a directory").
  CLI::Option* text(const std::string& name, std::string& field, const std::string& type, const std::string& if_empty,
                    const std::string& help) {
    return add(name, help, type, field, [&field, if_empty](const std::string& v) {
      if (v.empty()) throw std::invalid_argument(if_empty);
      field = v;
    });
  }

  /// An integer; `check` (optional) refuses a value out of the option's range.
  template <class T>
  CLI::Option* integer(const std::string& name, T& field, const std::string& help,
                       std::function<void(T, const std::string&)> check = {}) {
    return add(name, help, "INT", std::to_string(field), [&field, name, check](const std::string& v) {
      const T x = parse_int_as<T>(name, v);
      if (check) check(x, v);
      field = x;
    });
  }

  /// A real number into a float or double field; `check` (optional) refuses a value out
  /// of the option's range.
  template <class T>
  CLI::Option* real(const std::string& name, T& field, const std::string& help,
                    std::function<void(double, const std::string&)> check = {}) {
    return add(name, help, "X", CLI::detail::to_string(field), [&field, name, check](const std::string& v) {
      const double x = parse_real(name, v);
      if (check) check(x, v);
      field = static_cast<T>(x);
    });
  }

  /// on|off (also true|false, 1|0).
  CLI::Option* on_off(const std::string& name, bool& field, const std::string& help) {
    return add(name, help, "on|off", field ? "on" : "off",
               [&field, name](const std::string& v) { field = parse_bool(name, v); });
  }

  /// A flag without a value.
  CLI::Option* flag(const std::string& name, bool& field, const std::string& help) {
    return app_.add_flag(name, field, help)->group(group_);
  }

 private:
  CLI::Option* add(const std::string& name, const std::string& help, const std::string& type,
                   const std::string& shown_default, std::function<void(const std::string&)> set) {
    CLI::Option* opt = app_.add_option_function<std::string>(name, std::move(set), help);
    opt->type_name(type)->group(group_);
    if (!shown_default.empty()) opt->default_str(shown_default);
    return opt;
  }

  CLI::App& app_;
  std::string group_ = "Options";
};

/// The size overrides (--vocab ...): read after the parse, applied to the named size.
struct SizeOverrides {
  std::int64_t vocab = 0, hidden = 0, mlp = 0, expert_mlp = 0, tokens = 0, context = 0;
  int layers = 0, experts = 0, heads = 0;
  double capacity_factor = 0.0;
};

void add_options(CLI::App& app, TrainOptions& o, SizeOverrides& sz, ProgramOptions* program) {
  Declare d(app);

  d.group("Model");
  d.choice("--model", o.model_kind, {"moe", "gpt"},
           "moe: MLP + MoE blocks; gpt: attention + MLP blocks (a GPT)");
  d.choice("--size", o.size, {"tiny", "small", "1b", "baby"},
           "model size: moe tiny|small|1b, gpt tiny|small|baby");
  d.choice("--experts", o.experts, {"single", "discrete"}, "one grouped tensor per MoE weight, or G tensors");
  // Size overrides: no default shown (the size's), applied after --model and --size.
  const auto override = [&](const std::string& name, auto& field, const std::string& help) {
    CLI::Option* opt = nullptr;
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, double>)
      opt = d.real(name, field, help);
    else
      opt = d.integer(name, field, help);
    opt->default_str("");
    return opt;
  };
  override("--vocab", sz.vocab, "vocabulary V (size override; --task shakespeare: the data's)");
  override("--hidden", sz.hidden, "hidden width H (size override)");
  override("--layers", sz.layers, "blocks N (size override)");
  override("--mlp", sz.mlp, "dense MLP width F (size override)");
  override("--num-experts", sz.experts, "experts G (moe; size override; at most 64)");
  override("--expert-mlp", sz.expert_mlp, "width of one expert's MLP (moe; size override)");
  override("--tokens", sz.tokens, "tokens per microbatch per rank T (size override)");
  override("--capacity-factor", sz.capacity_factor, "expert capacity ceil(X * T / G) (moe; size override)");
  override("--heads", sz.heads, "attention heads (gpt; size override; H a multiple of it)");
  override("--context", sz.context, "sequence length S (gpt; size override; T a multiple of it)");

  d.group("Task");
  d.choice("--task", o.task, {"synthetic", "shakespeare"},
           "synthetic: a rule on random tokens; shakespeare: the next\n"
           "character of Shakespeare's works (--data)");
  d.text("--data", o.data_dir, "DIR", "--data needs a directory",
         "token files of --task shakespeare\n"
         "(tools/shakespeare_data.py's output)");
  d.integer<int>("--eval-every", o.eval_every,
                 "validation loss every K steps on --eval-batches fixed batches\n"
                 "(also after the last step; 0 and --task shakespeare: only then)",
                 [](int k, const std::string&) {
                   if (k < 0) throw std::invalid_argument("--eval-every takes steps >= 0");
                 });
  d.integer<int>("--eval-batches", o.eval_batches, "fixed validation batches per evaluation (per rank)",
                 [](int k, const std::string&) {
                   if (k < 1) throw std::invalid_argument("--eval-batches takes at least 1");
                 });
  d.integer<int>("--sample", o.sample_chars, "characters of generated text at the end (gpt, shakespeare)",
                 [](int k, const std::string&) {
                   if (k < 0) throw std::invalid_argument("--sample takes characters >= 0");
                 });

  d.group("Optimizer");
  d.choice("--mode", o.mode, {"dist-adam", "fsdp"}, "distributed Adam (ZeRO-1/2) or FSDP (ZeRO-3)");
  d.choice("--optimizer", o.optimizer, {"adamw", "muon"},
           "adamw: AdamW for every parameter; muon: Muon (Newton-Schulz,\n"
           "on GPUs with CUDA or on the host) for the hidden 2-D matrices\n"
           "(attention, MLP, router) and each MoE expert, AdamW for the\n"
           "embeddings, head and norms (same lr: Muon's match_rms_adamw\n"
           "scaling; --weight-decay for both; --params bf16)");
  d.choice("--params", o.params, {"bf16", "mxfp8", "nvfp4"},
           "parameter format (mxfp8 / nvfp4: 2-D weights stored as MXFP8 /\n"
           "NVFP4, decoded to bf16 for the GEMMs; nvfp4: dist-adam only)");
  d.choice("--grad-dtype", o.grad_dtype, {"fp32", "bf16"}, "gradient buffer dtype");
  d.choice("--master", o.master, names_of(kMasterChoices),
           help_of(kMasterChoices, "the optimizer's master (docs/state_precision.md):"));
  d.choice("--moments", o.moments, names_of(kMomentChoices), help_of(kMomentChoices, "dtype of the Adam moments:"));
  d.real("--offload", o.offload,
         "share of the optimizer state kept in pinned host memory and\n"
         "streamed through the GPU each step, in [0, 1] (docs/offload.md)",
         [](double f, const std::string& text) {
           if (!(f >= 0.0 && f <= 1.0)) throw std::invalid_argument("--offload takes a share in [0, 1], not '" + text + "'");
         });
  d.integer<int>("--microbatches", o.microbatches, "microbatches per step (gradient accumulation)");
  d.integer<int>("--steps", o.steps, "steps to train (with --resume: the total to reach)");
  d.real("--lr", o.lr, "peak learning rate (default: the size's)")->default_str("");
  d.integer<int>("--warmup-steps", o.warmup_steps, "linear warm-up steps, then cosine decay (default: steps / 10)")
      ->default_str("");
  d.real("--clip", o.clip, "global-norm gradient clipping (0: off)");
  d.real("--weight-decay", o.weight_decay, "decoupled weight decay");
  d.integer<std::uint64_t>("--seed", o.seed, "seed of the weights and the data");

  d.group("Run");
  d.choice("--backend", o.backend, {"auto", "cuda", "host"},
           "auto: cuda when built with CUDA and a GPU is visible, else host");
  d.on_off("--graph", o.graph, "capture the whole iteration in one graph");
  d.on_off("--group-norms", o.group_norms, "per-group gradient norms on the device");
  d.integer<int>("--log-every", o.log_every, "a progress line every K steps (0: about 20 lines)");
  d.flag("--quiet", o.quiet, "only the summary (no progress lines)");
  d.integer<long long>("--timeout-ms", o.timeout_ms,
                       "a collective, wait or replayed step slower than MS ms (a dead\n"
                       "or stuck rank) stops every live rank with a timeout error (0: off;\n"
                       "default: replays 5 minutes, waits unbounded)",
                       [](long long ms, const std::string& v) {
                         if (ms < 0)
                           throw std::invalid_argument("--timeout-ms takes milliseconds >= 0 (0: off), not '" + v +
                                                       "'");
                       })
      ->type_name("MS")
      ->default_str("");

  d.group("Checkpoints");
  d.text("--save-dir", o.save_dir, "DIR", "--save-dir needs a directory",
         "save checkpoints into DIR/step-NNNNN (the step, zero-padded to\n"
         "5 digits): after the last step, and every K-th with --save-every");
  d.integer<int>("--save-every", o.save_every, "also save after every K-th step (needs --save-dir)",
                 [](int k, const std::string& v) {
                   if (k < 1)
                     throw std::invalid_argument("--save-every takes a number of steps of at least 1, not '" + v + "'");
                   if (k > 1000000000) throw std::invalid_argument("--save-every " + v + " is too large");
                 })
      ->type_name("K")
      ->default_str("");
  d.text("--resume", o.resume, "CKPT", "--resume needs a checkpoint directory",
         "load the checkpoint directory CKPT (e.g. DIR/step-00010) before\n"
         "training and continue from its step: --steps is the total to reach");
  if (program == nullptr) return;
  d.text("--save-init", program->save_init, "DIR", "--save-init needs a directory",
         "save the initial weights (a checkpoint of step 0) into DIR");

  d.group("Output and checks");
  d.text("--metrics", program->metrics_path, "FILE", "--metrics needs a file",
         "rank 0 writes every step's loss, grad norm, lr, step time and\n"
         "tokens/s to FILE as JSON lines");
  d.real("--expect-loss-below", program->expect_loss_below, "exit 1 unless the last logged loss is below X")
      ->default_str("");
  d.real("--expect-val-loss-below", program->expect_val_loss_below,
         "exit 1 unless the final validation loss is below X")
      ->default_str("");
}

/// The app: its name, description and help flag (which wins over anything else given).
void describe(CLI::App& app) {
  app.name("trainer");
  app.description(
      "shardopt's example trainer: one rank per GPU under mpirun; the host backend without GPUs.\n"
      "  mpirun -n 2 trainer --size tiny --steps 200");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // the last one given wins
  app.set_help_flag();
  app.add_flag_callback("-h,--help", [] { throw CLI::CallForHelp(); }, "print this help and exit")
      ->trigger_on_parse();
  app.allow_extras();  // reported by parse() in the trainer's words
  app.get_formatter()->column_width(34);
}

void apply(const SizeOverrides& sz, const CLI::App& app, ModelConfig& m) {
  const auto given = [&](const char* name) { return app.get_option(name)->count() > 0; };
  if (given("--vocab")) m.vocab = sz.vocab;
  if (given("--hidden")) m.hidden = sz.hidden;
  if (given("--layers")) m.layers = sz.layers;
  if (given("--mlp")) m.mlp = sz.mlp;
  if (given("--num-experts")) m.experts = sz.experts;
  if (given("--expert-mlp")) m.expert_mlp = sz.expert_mlp;
  if (given("--tokens")) m.tokens = sz.tokens;
  if (given("--capacity-factor")) m.capacity_factor = sz.capacity_factor;
  if (given("--heads")) m.heads = sz.heads;
  if (given("--context")) m.context = sz.context;
}

/// CLI11 counts "--opt=" as a missing value; the trainer takes it as an empty one (which
/// the option then refuses in its own words: "--save-dir needs a directory").
std::vector<std::string> with_empty_values(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=' && a.find('=') == a.size() - 1) {
      out.push_back(a.substr(0, a.size() - 1));
      out.emplace_back();
    } else {
      out.push_back(a);
    }
  }
  return out;
}

/// Parses `args` into `line` (program == nullptr: the training options only).
void parse(const std::vector<std::string>& args, CommandLine& line, bool program) {
  CLI::App app;
  describe(app);
  SizeOverrides sz;
  add_options(app, line.train, sz, program ? &line.program : nullptr);
  std::vector<std::string> reversed = with_empty_values(args);  // CLI11 takes them last first
  std::reverse(reversed.begin(), reversed.end());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    line.help = true;
    return;
  } catch (const CLI::ArgumentMismatch& e) {
    // "--steps: 1 required INT missing": a value-taking option at the end.
    const std::string what = e.what();
    throw std::invalid_argument(what.substr(0, what.find(':')) + " needs a value");
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(std::string(e.what()) + " (see --help)");
  }
  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty()) throw std::invalid_argument("unknown option '" + extra.front() + "' (see --help)");

  TrainOptions& o = line.train;
  o.model = o.model_kind == "gpt" ? gpt_size(o.size) : model_size(o.size);
  apply(sz, app, o.model);
  validate(o.model);
  if (o.microbatches < 1) throw std::invalid_argument("--microbatches must be at least 1");
  if (o.steps < 1) throw std::invalid_argument("--steps must be at least 1");
  if (o.save_every > 0 && o.save_dir.empty())
    throw std::invalid_argument("--save-every needs --save-dir (where to write the checkpoints)");
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine line;
  parse(args, line, true);
  return line;
}

TrainOptions parse_options(const std::vector<std::string>& args) {
  CommandLine line;
  parse(args, line, false);
  if (line.help) throw std::invalid_argument("--help: see usage()");
  return line.train;
}

std::string usage() {
  CLI::App app;
  describe(app);
  CommandLine line;
  SizeOverrides sz;
  add_options(app, line.train, sz, &line.program);
  return app.help();
}

}  // namespace trainer
