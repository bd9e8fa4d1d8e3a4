#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include <shardopt/backend.hpp>
#include <shardopt/error.hpp>

#include "op_math.hpp"
#include "state_precision.hpp"

namespace trainer {

shardopt::Backend choose_backend(const TrainOptions& o) {
  if (o.backend == "host") return shardopt::Backend::Host;
  if (o.backend == "cuda") {
    if (!cuda_ops_built())
      throw std::runtime_error("--backend cuda: this trainer was built without CUDA (rebuild with nvcc and cuBLAS)");
    return shardopt::Backend::Cuda;
  }
  if (!cuda_ops_built()) return shardopt::Backend::Host;
  return shardopt::default_backend();
}

namespace {

// --timeout-ms: both deadlines of the optimizer's watchdog (-1 keeps the library's).
// --master, --moments and --offload: how and where the optimizer state is kept
// (docs/state_precision.md, docs/offload.md).
void apply_state_precision(const TrainOptions& t, shardopt::AdamOptions& o) {
  o.master_storage = choice_value(kMasterChoices, "--master", t.master);
  o.moment_dtype = choice_value(kMomentChoices, "--moments", t.moments);
  o.offload_fraction = t.offload;
}

void apply_timeout(const TrainOptions& t, shardopt::AdamOptions& o) {
  if (t.timeout_ms < 0) return;
  o.watchdog = shardopt::WatchdogOptions{std::chrono::milliseconds(t.timeout_ms),
                                         std::chrono::milliseconds(t.timeout_ms)};
}

shardopt::LrSchedule schedule_of(const TrainOptions& o, float lr) {
  const int warmup = o.warmup_steps >= 0 ? o.warmup_steps : o.steps / 10;
  return shardopt::LrSchedule::warmup_cosine(lr, lr * o.min_lr_ratio, warmup, o.steps);
}

/// The mean over the ranks of one double per rank (bitwise the same on every rank).
double mean_over_ranks(const shardopt::Communicator& comm, double mine) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &mine, sizeof bits);
  double total = 0.0;
  for (std::uint64_t b : comm.all_gather_value(bits)) {
    double v = 0.0;
    std::memcpy(&v, &b, sizeof v);
    total += v;
  }
  return total / comm.size();
}

float default_lr(const std::string& size) {
  if (size == "tiny") return 1e-2f;
  if (size == "small") return 3e-3f;
  return 1e-3f;
}

}  // namespace

void check_supported(const TrainOptions& o) {
  if (o.params == "nvfp4" && o.mode == "fsdp")
    throw std::runtime_error(
        "--params nvfp4 --mode fsdp: shardopt has no NVFP4 parameters in FSDP (ZeRO-3); its NVFP4 parameter path "
        "(ParamFormat::Nvfp4, docs/nvfp4.md) is DistributedAdam's. Use --mode dist-adam with --params nvfp4, or "
        "--params bf16 with --mode fsdp.");
  if (o.optimizer == "muon" && o.params != "bf16")
    throw std::runtime_error("--optimizer muon --params " + o.params + ": shardopt's Muon groups take native "
                             "parameters only (docs/muon.md); use --params bf16 with --optimizer muon, or "
                             "--optimizer adamw with --params " + o.params + ".");
}

void prepare_task(TrainOptions& o) {
  if (o.task != "shakespeare") return;
  o.model.vocab = read_text_manifest(o.data_dir).vocab_size;
  validate(o.model);
}

Trainer::Trainer(const TrainOptions& options, shardopt::Communicator comm, TrainerTestHooks hooks)
    : options_(options), hooks_(hooks), comm_(std::move(comm)) {
  check_supported(options_);
  prepare_task(options_);
  validate(options_.model);
  spec_ = std::make_unique<ModelSpec>(options_.model, options_.experts == "discrete");
  const shardopt::Backend backend = comm_.backend();
  ops_ = backend == shardopt::Backend::Cuda ? make_cuda_ops() : make_host_ops(Precision::Mixed);
  if (options_.task == "shakespeare") {
    // Every rank maps the token files; on a GPU they are copied to device memory once (a
    // few MB), where the batch kernel reads its windows.
    text_ = read_text_manifest(options_.data_dir);
    train_map_ = std::make_unique<MappedTokens>(options_.data_dir + "/train.bin", text_.train_tokens);
    val_map_ = std::make_unique<MappedTokens>(options_.data_dir + "/val.bin", text_.val_tokens);
    const std::int64_t context = options_.model.gpt ? options_.model.context : options_.model.tokens;
    if (val_map_->size() <= context || train_map_->size() <= context)
      throw std::runtime_error("--data " + options_.data_dir + ": a token file is not longer than one window of " +
                               std::to_string(context) + " tokens");
    if (backend == shardopt::Backend::Cuda) {
      train_dev_ = ops_->alloc(Elem::u8, train_map_->size());
      val_dev_ = ops_->alloc(Elem::u8, val_map_->size());
      ops_->upload(train_dev_, train_map_->data());
      ops_->upload(val_dev_, val_map_->data());
      train_tokens_ = train_dev_.as<std::uint8_t>();
      val_tokens_ = val_dev_.as<std::uint8_t>();
    } else {
      train_tokens_ = train_map_->data();
      val_tokens_ = val_map_->data();
    }
  }

  const float lr = options_.lr > 0.0f ? options_.lr : default_lr(options_.size);
  const shardopt::DType grad_dtype = options_.grad_dtype == "bf16" ? shardopt::DType::bf16 : shardopt::DType::f32;
  const shardopt::AdamGroup decay{options_.weight_decay, 1.0f}, no_decay{0.0f, 1.0f};
  // --optimizer muon: Muon for the hidden matrices and experts at the same lr and decay as
  // AdamW's (match_rms_adamw scales each update to AdamW's RMS, torch.optim.Muon's choice
  // for reusing AdamW's settings); the other Muon settings are torch's defaults.
  const bool muon = options_.optimizer == "muon";
  shardopt::AdamGroup muon_group;
  muon_group.algorithm = shardopt::GroupAlgorithm::Muon;
  muon_group.muon.weight_decay = options_.weight_decay;
  muon_group.muon.adjust_lr = shardopt::MuonLrAdjust::MatchRmsAdamW;
  const shardopt::MicrobatchState* microbatch = nullptr;
  const shardopt::StepScalars* scalars = nullptr;
  if (options_.mode == "dist-adam") {
    shardopt::DistributedAdamOptions o;
    apply_timeout(options_, o);
    if (mxfp8())
      o.param_format = shardopt::ParamFormat::Mxfp8;  // 2-D weights MXFP8, 1-D ones native f32
    else if (nvfp4())
      o.param_format = shardopt::ParamFormat::Nvfp4;  // 2-D weights NVFP4, 1-D ones native f32
    else
      o.param_dtype = shardopt::DType::bf16;
    o.grad_dtype = grad_dtype;
    apply_state_precision(options_, o);
    if (hooks_.bucket_numel > 0) o.bucket_numel = hooks_.bucket_numel;
    o.clip_max_norm = options_.clip;
    o.groups["decay"] = decay;
    o.groups["no_decay"] = no_decay;
    if (muon) o.groups["muon"] = muon_group;
    o.lr_schedule = schedule_of(options_, lr);
    o.microbatches = options_.microbatches;
    adam_ = std::make_unique<shardopt::DistributedAdam>(comm_, spec_->specs(muon), o);
    weights_ = make_dist_adam_weights(*adam_, *spec_);
    microbatch = adam_->device_microbatch();
    scalars = adam_->device_scalars();
  } else if (options_.mode == "fsdp") {
    shardopt::FsdpOptions o;
    apply_timeout(options_, o);
    o.param_dtype = shardopt::DType::bf16;
    o.grad_dtype = grad_dtype;
    o.slot_grad_dtype = grad_dtype;
    apply_state_precision(options_, o);
    if (hooks_.bucket_numel > 0) o.bucket_numel = hooks_.bucket_numel;
    o.clip_max_norm = options_.clip;
    o.groups["decay"] = decay;
    o.groups["no_decay"] = no_decay;
    if (muon) o.groups["muon"] = muon_group;
    o.lr_schedule = schedule_of(options_, lr);
    o.microbatches = options_.microbatches;
    if (mxfp8()) o.param_format = shardopt::ParamFormat::Mxfp8;  // one plane gathered per pass
    fsdp_ = std::make_unique<shardopt::Fsdp>(comm_, spec_->specs(muon), spec_->units(), o);
    weights_ = make_fsdp_weights(*fsdp_, *spec_);
    microbatch = fsdp_->device_microbatch();
    scalars = fsdp_->device_scalars();
  } else {
    throw std::invalid_argument("unknown --mode '" + options_.mode + "'");
  }
  init_params();

  ModelOptions mo;
  mo.microbatches = options_.microbatches;
  mo.batch.scalars = scalars;
  mo.batch.microbatch = microbatch;
  mo.batch.seed = options_.seed;
  mo.batch.rank = comm_.rank();
  mo.microbatch = microbatch;
  mo.grad_stats = options_.group_norms;
  mo.gathered_weights = fsdp_ != nullptr;
  mo.mxfp8_params = mxfp8();
  mo.nvfp4_params = nvfp4();
  mo.seed000_host_flag = hooks_.seed000_host_flag;
  mo.text = train_tokens_;
  mo.text_tokens = train_map_ ? train_map_->size() : 0;
  model_ = std::make_unique<Model>(*spec_, *ops_, mo);

  auto fn = [this](shardopt::Stream s, bool) { model_->microbatch(*weights_, s); };
  shardopt::StepGraphOptions go;
  go.warmup_iterations = 1;
  go.one_graph = hooks_.one_graph;
  if (adam_)
    graph_ = std::make_unique<shardopt::StepGraph>(*adam_, fn, go);
  else
    graph_ = std::make_unique<shardopt::StepGraph>(*fsdp_, fn, go);
}

Trainer::~Trainer() {
  try {
    if (ops_) ops_->synchronize();
  } catch (...) {
  }
}

void Trainer::init_params() {
  const shardopt::Stream s = ops_->stream();
  if (mxfp8() || nvfp4()) {
    // Quantized parameters have no param views or shards: every rank writes the fp32
    // initial values of its own master pieces, and init_from_master publishes them
    // (DistributedAdam quantizes, gathers and lands them; Fsdp quantizes its shard
    // planes; the 1-D parameters are published from the master as they are).
    for (int i = 0; i < spec_->num_params(); ++i) {
      const shardopt::ShardView piece = adam_ ? adam_->shard_master(i) : fsdp_->shard_master(i);
      if (piece.numel() == 0) continue;
      InitArgs a = spec_->init_args(i);
      a.offset = piece.param_offset;
      ops_->init_param(from_view(piece), a, s);
    }
    if (adam_)
      adam_->init_from_master(s);
    else
      fsdp_->init_from_master(s);
    ops_->synchronize();
    return;
  }
  for (int i = 0; i < spec_->num_params(); ++i) {
    InitArgs a = spec_->init_args(i);
    if (adam_) {
      // Every rank writes the same full values; init_master keeps the owners'.
      ops_->init_param(from_view(adam_->param(i)), a, s);
    } else {
      const shardopt::ShardView piece = fsdp_->shard_param(i);
      if (piece.numel() == 0) continue;
      a.offset = piece.param_offset;
      ops_->init_param(from_view(piece), a, s);
    }
  }
  if (adam_)
    adam_->init_master(s);
  else
    fsdp_->init_master(s);
  ops_->synchronize();
}

void Trainer::step() {
  const shardopt::Stream s = ops_->stream();
  if (!options_.graph) {
    graph_->run_eager(s);
  } else if (!graph_->captured()) {
    graph_->capture(s);  // one eager warm-up iteration (it trains), then the capture
  } else {
    graph_->replay(s);
  }
  ++iterations_;
}

void Trainer::optimizer_step_only() {
  const shardopt::Stream s = ops_->stream();
  if (options_.graph && graph_->captured() && !hooks_.one_graph && adam_) {
    graph_->replay_step(s);
  } else if (adam_) {
    adam_->step(s);
    adam_->zero_grad(s);
  } else {
    throw std::logic_error("optimizer_step_only: FSDP's step is part of its one-graph iteration");
  }
}

// Waits for the trainer's stream through the optimizer, so that the watchdog's deadline
// and failure state apply (a bare stream synchronization would block forever on a hang).
void Trainer::synchronize() {
  if (adam_) {
    adam_->synchronize(ops_->stream());
  } else if (fsdp_) {
    fsdp_->synchronize(ops_->stream());
  } else {
    ops_->synchronize();
  }
}

StepStats Trainer::stats() {
  synchronize();
  StepStats st;
  const shardopt::StepScalars sc = adam_ ? adam_->read_scalars(ops_->stream()) : fsdp_->read_scalars(ops_->stream());
  st.step = sc.step;
  st.grad_norm = sc.grad_norm;
  st.lr = sc.lr;
  st.skipped = sc.found_inf != 0;
  std::vector<float> losses(static_cast<std::size_t>(options_.microbatches));
  ops_->download(losses.data(), model_->loss_slots());
  double mine = 0.0;
  for (float l : losses) {
    st.microbatch_loss.push_back(l);
    mine += l;
  }
  mine /= static_cast<double>(losses.size());
  st.loss = mean_over_ranks(comm_, mine);
  if (options_.group_norms) {
    std::vector<float> sq(static_cast<std::size_t>(spec_->num_params()));
    ops_->download(sq.data(), model_->grad_sumsq());
    std::array<double, kNormGroups> sums{};
    for (int i = 0; i < spec_->num_params(); ++i) {
      st.param_sumsq.push_back(sq[static_cast<std::size_t>(i)]);
      sums[static_cast<std::size_t>(spec_->params()[static_cast<std::size_t>(i)].group)] += sq[static_cast<std::size_t>(i)];
    }
    for (int g = 0; g < kNormGroups; ++g) st.group_norm[static_cast<std::size_t>(g)] = std::sqrt(sums[static_cast<std::size_t>(g)]);
  }
  return st;
}

double Trainer::evaluate() {
  synchronize();
  const shardopt::Stream s = ops_->stream();
  double sum = 0.0;
  for (int k = 0; k < options_.eval_batches; ++k) {
    model_->make_eval_batch(k, val_tokens_, val_map_ ? val_map_->size() : 0, s);
    model_->eval_forward(*weights_, s);
    synchronize();
    float loss = 0.0f;
    ops_->download(&loss, model_->eval_loss());
    sum += loss;
  }
  return mean_over_ranks(comm_, sum / options_.eval_batches);
}

std::string Trainer::sample(int chars, std::uint64_t seed) {
  if (!options_.model.gpt || options_.task != "shakespeare")
    throw std::logic_error("Trainer::sample: --model gpt --task shakespeare only");
  synchronize();
  const shardopt::Stream s = ops_->stream();
  const ModelConfig& c = options_.model;
  std::int32_t newline = 0;
  for (std::size_t i = 0; i < text_.chars.size(); ++i)
    if (text_.chars[i] == "\n") newline = static_cast<std::int32_t>(i);
  std::vector<std::int32_t> text{newline}, tokens(static_cast<std::size_t>(c.tokens), 0),
      targets(static_cast<std::size_t>(c.tokens), 0);
  std::vector<float> logits(static_cast<std::size_t>(c.vocab));
  for (int i = 0; i < chars; ++i) {
    // The last `context` characters in sequence 0 (causal: the rest of the batch is not seen).
    const std::size_t n = std::min<std::size_t>(text.size(), static_cast<std::size_t>(c.context));
    std::copy(text.end() - static_cast<std::ptrdiff_t>(n), text.end(), tokens.begin());
    model_->set_batch(tokens, targets);
    model_->eval_forward(*weights_, s);
    synchronize();
    ops_->download(logits.data(), model_->logits().slice(static_cast<std::int64_t>(n - 1) * c.vocab, c.vocab));
    const float top = *std::max_element(logits.begin(), logits.end());
    double total = 0.0;
    for (float l : logits) total += std::exp(static_cast<double>(l - top));
    const double u = static_cast<double>(math::mix(seed ^ math::mix(static_cast<std::uint64_t>(i))) >> 11) * 0x1.0p-53;
    double acc = 0.0;
    std::int32_t pick = static_cast<std::int32_t>(c.vocab - 1);
    for (std::int64_t v = 0; v < c.vocab; ++v) {
      acc += std::exp(static_cast<double>(logits[static_cast<std::size_t>(v)] - top)) / total;
      if (u < acc) {
        pick = static_cast<std::int32_t>(v);
        break;
      }
    }
    text.push_back(pick);
  }
  return decode_text(text_.chars, std::vector<std::int32_t>(text.begin() + 1, text.end()));
}

// The user map. The batch of microbatch m of an iteration is a pure function of (seed,
// rank, the device step count, m, position) (Ops::make_batch), so the data position is the
// step count, which the optimizer saves and restores on the device; the microbatch index
// (device MicrobatchState) is 0 between iterations, where saves happen. What the trainer
// adds:
//   trainer.format        1
//   trainer.iterations    iterations run (more than the step count after skipped steps)
//   trainer.seed          the data seed (restored on load)
//   trainer.step          the step count at the save (the data position; a check)
//   trainer.world_size, trainer.microbatches, trainer.tokens
//                         the shape of the data stream: each rank draws its own tokens,
//                         so a run continues identically only with the same values
//   trainer.mode, trainer.experts, trainer.params, trainer.grad_dtype, trainer.size,
//   trainer.steps         for the record (a checkpoint loads into any of these)
shardopt::CheckpointUserData Trainer::checkpoint_user_data() {
  ops_->synchronize();
  const shardopt::MicrobatchState* mb = adam_ ? adam_->device_microbatch() : fsdp_->device_microbatch();
  shardopt::MicrobatchState state;
  ops_->download(&state, Tensor{const_cast<shardopt::MicrobatchState*>(mb), Elem::u8,
                                static_cast<std::int64_t>(sizeof state)});
  if (state.index != 0)
    throw std::logic_error("Trainer::save: microbatch " + std::to_string(state.index) +
                           " of an iteration is in progress; save between iterations");
  const shardopt::StepScalars sc = adam_ ? adam_->read_scalars(ops_->stream()) : fsdp_->read_scalars(ops_->stream());
  return {
      {"trainer.format", "1"},
      {"trainer.iterations", std::to_string(iterations_)},
      {"trainer.seed", std::to_string(options_.seed)},
      {"trainer.step", std::to_string(sc.step)},
      {"trainer.world_size", std::to_string(comm_.size())},
      {"trainer.microbatches", std::to_string(options_.microbatches)},
      {"trainer.tokens", std::to_string(options_.model.tokens)},
      {"trainer.mode", options_.mode},
      {"trainer.experts", options_.experts},
      {"trainer.params", options_.params},
      {"trainer.grad_dtype", options_.grad_dtype},
      {"trainer.master", options_.master},
      {"trainer.moments", options_.moments},
      {"trainer.size", options_.size},
      {"trainer.steps", std::to_string(options_.steps)},
      {"trainer.model", options_.model_kind},
      {"trainer.task", options_.task},
      {"trainer.optimizer", options_.optimizer},
  };
}

void Trainer::save(const std::string& dir) {
  const shardopt::CheckpointUserData user = checkpoint_user_data();
  if (adam_)
    adam_->save(dir, ops_->stream(), user);
  else
    fsdp_->save(dir, ops_->stream(), user);
}

shardopt::SaveHandle Trainer::save_async(const std::string& dir) {
  const shardopt::CheckpointUserData user = checkpoint_user_data();
  return adam_ ? adam_->save_async(dir, ops_->stream(), user) : fsdp_->save_async(dir, ops_->stream(), user);
}

namespace {

/// The value of `key` in a checkpoint's user map, or "" (a checkpoint of another program).
std::string user_value(const shardopt::CheckpointInfo& info, const std::string& key) {
  const auto it = info.user.find(key);
  return it == info.user.end() ? std::string() : it->second;
}

}  // namespace

shardopt::CheckpointInfo Trainer::load(const std::string& dir) {
  // The seed is read by the batch op at enqueue time, so a captured graph holds it: a
  // checkpoint of another seed can be continued only before the capture.
  const shardopt::Stream s = ops_->stream();
  shardopt::CheckpointInfo info = adam_ ? adam_->load(dir, s) : fsdp_->load(dir, s);
  const std::string seed = user_value(info, "trainer.seed");
  if (!seed.empty()) {
    const std::uint64_t saved = std::stoull(seed);
    if (saved != options_.seed) {
      if (graph_->captured())
        throw std::runtime_error("Trainer::load: '" + dir + "' was saved with --seed " + seed +
                                 ", and this trainer's captured graph draws its batches with --seed " +
                                 std::to_string(options_.seed) + "; load it before the first step (or use --seed " +
                                 seed + ")");
      options_.seed = saved;
      model_->set_seed(saved);
    }
  }
  const std::string iterations = user_value(info, "trainer.iterations");
  iterations_ = iterations.empty() ? static_cast<int>(info.step) : std::stoi(iterations);
  // Weights prepared for compute (MXFP8 decodes, packed discrete experts) hold the old
  // weights until the next step's first microbatch refreshes them; refresh them now so
  // that nothing derived from the parameters is stale after a load.
  model_->refresh_weights(*weights_, s);
  ops_->synchronize();
  return info;
}

std::string Trainer::resume_differences(const shardopt::CheckpointInfo& info) const {
  std::string out;
  auto check = [&](const char* key, const std::string& mine, const char* what) {
    const std::string saved = user_value(info, std::string("trainer.") + key);
    if (saved.empty() || saved == mine) return;
    out += (out.empty() ? "" : "; ") + std::string(what) + " " + saved + " then, " + mine + " now";
  };
  if (user_value(info, "trainer.format").empty()) return "it has no trainer values (not saved by this trainer)";
  check("world_size", std::to_string(comm_.size()), "ranks:");
  check("microbatches", std::to_string(options_.microbatches), "microbatches:");
  check("tokens", std::to_string(options_.model.tokens), "tokens per microbatch:");
  check("seed", std::to_string(options_.seed), "--seed:");
  if (!out.empty()) out = "the data stream differs (" + out + ")";
  std::string schedule;
  const std::string steps = user_value(info, "trainer.steps");
  if (!steps.empty() && steps != std::to_string(options_.steps))
    schedule = "the learning-rate schedule differs (--steps " + steps + " then, " + std::to_string(options_.steps) +
               " now: the cosine decays over --steps)";
  if (!schedule.empty()) out += (out.empty() ? "" : "; ") + schedule;
  return out;
}

MemoryUse Trainer::memory() const {
  MemoryUse m;
  m.optimizer = adam_ ? adam_->memory().total() : fsdp_->memory().total();
  m.activations = model_->workspace_bytes();
  m.device = ops_->memory_in_use();
  return m;
}

std::int64_t Trainer::tokens_per_step() const noexcept {
  return options_.model.tokens * options_.microbatches * comm_.size();
}

std::vector<std::uint8_t> Trainer::param_bytes(int i, int member) const {
  if (adam_ && adam_->is_mxfp8(i)) return mxfp8_bytes(i, member);
  if (adam_ && adam_->is_nvfp4(i)) return nvfp4_bytes(i, member);
  Tensor t;
  if (adam_) {
    t = from_view(member < 0 ? shardopt::TensorView(adam_->param(i)) : shardopt::TensorView(adam_->member_param(i, member)));
  } else {
    if (member >= 0) throw std::invalid_argument("param_bytes: FSDP holds shard pieces, not members");
    t = from_view(fsdp_->shard_param(i));
  }
  std::vector<std::uint8_t> out(t.bytes());
  if (!out.empty()) ops_->download(out.data(), t);
  return out;
}

std::vector<std::uint8_t> Trainer::mxfp8_bytes(int i, int member) const {
  const shardopt::Mxfp8View v = adam_->mxfp8_param(i);
  const shardopt::Mxfp8Shape& sh = v.shape;
  // The member table says where each member's bytes are (read here, outside any step).
  std::vector<shardopt::Mxfp8Member> table(static_cast<std::size_t>(sh.members));
  ops_->download(table.data(), Tensor{const_cast<shardopt::Mxfp8Member*>(v.members), Elem::u8,
                                      static_cast<std::int64_t>(table.size() * sizeof(shardopt::Mxfp8Member))});
  const std::int64_t first = member < 0 ? 0 : member, count = member < 0 ? sh.members : 1;
  if (member >= sh.members) throw std::out_of_range("mxfp8_bytes: no member " + std::to_string(member));
  std::vector<std::uint8_t> out;
  auto append = [&](const std::uint8_t* base, std::int64_t offset, std::int64_t n) {
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(n));
    ops_->download(out.data() + at, Tensor{const_cast<std::uint8_t*>(base) + offset, Elem::u8, n});
  };
  for (std::int64_t g = first; g < first + count; ++g) {
    const shardopt::Mxfp8Member& m = table[static_cast<std::size_t>(g)];
    append(v.planes.data_row, m.element_offset, sh.member_numel());
    append(v.planes.scale_row, m.scale_row_offset, sh.rows * sh.row_blocks());
    append(v.planes.data_col, m.element_offset, sh.member_numel());
    append(v.planes.scale_col, m.scale_col_offset, sh.col_blocks() * sh.cols);
  }
  return out;
}

std::vector<std::uint8_t> Trainer::nvfp4_bytes(int i, int member) const {
  const shardopt::Nvfp4View v = adam_->nvfp4_param(i);
  if (member >= v.members) throw std::out_of_range("nvfp4_bytes: no member " + std::to_string(member));
  const std::int64_t first = member < 0 ? 0 : member, count = member < 0 ? v.members : 1;
  std::vector<std::uint8_t> out;
  auto append = [&](const void* p, std::int64_t n) {
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(n));
    ops_->download(out.data() + at, Tensor{const_cast<void*>(p), Elem::u8, n});
  };
  for (std::int64_t g = first; g < first + count; ++g) {
    const shardopt::Nvfp4Planes m = v.member(g);
    append(m.data, v.shape.data_bytes());
    append(m.scale, v.shape.scale_numel());
    append(m.amax, 4);
    append(m.decode_scale, 4);
  }
  return out;
}

}  // namespace trainer
