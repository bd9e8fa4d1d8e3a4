// trainer.hpp - a training run on the public shardopt API: the optimizer (distributed
// Adam or FSDP), the model on CUDA or the host backend, and the iteration, eager or
// captured in one graph after warm-up.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <shardopt/checkpoint.hpp>
#include <shardopt/communicator.hpp>
#include <shardopt/distributed_adam.hpp>
#include <shardopt/fsdp.hpp>
#include <shardopt/step_graph.hpp>

#include "config.hpp"
#include "model.hpp"
#include "model_spec.hpp"
#include "ops.hpp"
#include "text_data.hpp"
#include "weights.hpp"

namespace trainer {

/// What a step leaves to report (read after the step, outside any capture).
struct StepStats {
  std::int64_t step = 0;          ///< optimizer steps applied so far
  double loss = 0.0;              ///< mean token loss of the last iteration, over microbatches and ranks
  std::vector<double> microbatch_loss;  ///< this rank's mean token loss per microbatch
  float grad_norm = 0.0f;         ///< global norm of the last step's (reduced, unclipped) gradient
  float lr = 0.0f;                ///< learning rate of the last step
  bool skipped = false;           ///< the last step found a NaN/Inf gradient and changed nothing
  /// This rank's gradient norm per NormGroup, taken on the device before the step: of the
  /// accumulated gradients (dist-adam), or sqrt of the sum over microbatches of each
  /// microbatch's squared norm (fsdp, whose gradient slots hold one microbatch).
  std::array<double, kNormGroups> group_norm{};
  /// The same per parameter (squared), registration order.
  std::vector<double> param_sumsq;
};

/// Bytes held by this rank.
struct MemoryUse {
  std::int64_t optimizer = 0;    ///< MemoryReport::total() of the optimizer
  std::int64_t activations = 0;  ///< the model's activations and scratch
  std::int64_t device = 0;       ///< device memory in use (cudaMemGetInfo; 0 on the host)
};

/// Settings for tests, not on the command line.
struct TrainerTestHooks {
  /// StepGraph in one-graph mode (default) or split mode (one microbatch graph replayed
  /// for every microbatch but the last, then the last microbatch's and the step's).
  bool one_graph = true;
  /// Bucket threshold in elements (0: the library's default).
  std::int64_t bucket_numel = 0;
  /// Deliberately wrong: see ModelOptions::seed000_host_flag.
  bool seed000_host_flag = false;
};

class Trainer {
 public:
  /// Collective over `comm` (its backend picks CUDA or host ops). Throws
  /// std::invalid_argument / std::runtime_error / shardopt::Error with what to change.
  Trainer(const TrainOptions& options, shardopt::Communicator comm, TrainerTestHooks hooks = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One training iteration: every microbatch (forward, backward), the optimizer step and
  /// zero_grad. With --graph on, the first call runs one eager warm-up iteration and
  /// captures the iteration; later calls replay it.
  void step();
  /// Waits for the queued iterations.
  void synchronize();
  /// The values of the last step (synchronizes; collective over the ranks for the loss).
  StepStats stats();
  /// The optimizer step alone (step + zero_grad), e.g. to time it: eager, or the captured
  /// step graph when one was captured in split mode. Trains (it is a real step).
  void optimizer_step_only();

  /// Checkpoints (docs/checkpoints.md), between iterations, outside any capture. The
  /// optimizer's save with the trainer's own values in the user map (checkpoint_user_data):
  /// everything a Trainer built with the same options needs to continue bitwise as if it
  /// had not stopped. Collective.
  void save(const std::string& dir);
  /// The same without blocking training (the optimizer's save_async): call wait() on the
  /// handle on every rank before the next save and before exit.
  shardopt::SaveHandle save_async(const std::string& dir);
  /// Loads a checkpoint of any trainer run (other world size, mode, --experts, --params):
  /// the optimizer's load (in place: a captured graph stays valid and is replayed as it
  /// is; the step count, lr slot and loss scale are restored on the device), then the
  /// trainer's values from the user map (iterations, data seed) and the weights prepared
  /// for compute. Collective; a bad checkpoint is shardopt's Error on every rank.
  shardopt::CheckpointInfo load(const std::string& dir);
  /// The user map saved with a checkpoint (keys "trainer.*"; see the definition).
  shardopt::CheckpointUserData checkpoint_user_data();
  /// Empty when a run of these options continues the run that saved `info` identically;
  /// else why not (e.g. another world size or microbatch count: another data stream).
  std::string resume_differences(const shardopt::CheckpointInfo& info) const;

  /// The mean token loss of the fixed evaluation batches (--eval-batches per rank: windows
  /// of the validation file with --task shakespeare, else synthetic batches of another
  /// seed), over the ranks: forward only, between iterations; no gradient, loss slot or
  /// optimizer state changes. Collective.
  double evaluate();
  /// `chars` characters generated after a newline, drawn one by one from the model's
  /// softmax (temperature 1) with a generator seeded by `seed`: the same text on every
  /// rank. --model gpt --task shakespeare only (std::logic_error otherwise). Collective
  /// (FSDP gathers).
  std::string sample(int chars, std::uint64_t seed);

  MemoryUse memory() const;
  /// Tokens of one iteration over all ranks.
  std::int64_t tokens_per_step() const noexcept;
  int iterations() const noexcept { return iterations_; }

  const TrainOptions& options() const noexcept { return options_; }
  const ModelSpec& spec() const noexcept { return *spec_; }
  Ops& ops() const noexcept { return *ops_; }
  Model& model() const noexcept { return *model_; }
  const shardopt::Communicator& comm() const noexcept { return comm_; }
  shardopt::DistributedAdam* dist_adam() const noexcept { return adam_.get(); }
  shardopt::Fsdp* fsdp() const noexcept { return fsdp_.get(); }
  /// The bytes of parameter i (member `member` of a grouped tensor, -1: whole) as this
  /// rank holds them: the full view (dist-adam) or this rank's shard piece (fsdp). An MXFP8
  /// parameter gives, member after member, its rowwise data, rowwise scales, columnwise
  /// data and columnwise scales; an NVFP4 parameter, member after member, its data, block
  /// scales, amax and decode scale.
  std::vector<std::uint8_t> param_bytes(int i, int member = -1) const;
  /// True for --params mxfp8.
  bool mxfp8() const noexcept { return options_.params == "mxfp8"; }
  /// True for --params nvfp4.
  bool nvfp4() const noexcept { return options_.params == "nvfp4"; }

 private:
  void init_params();
  std::vector<std::uint8_t> mxfp8_bytes(int i, int member) const;
  std::vector<std::uint8_t> nvfp4_bytes(int i, int member) const;

  TrainOptions options_;
  TrainerTestHooks hooks_;
  shardopt::Communicator comm_;
  std::unique_ptr<ModelSpec> spec_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<shardopt::DistributedAdam> adam_;
  std::unique_ptr<shardopt::Fsdp> fsdp_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<shardopt::StepGraph> graph_;
  int iterations_ = 0;
  // --task shakespeare: the manifest, the mapped token files and (CUDA) their device copies.
  TextManifest text_;
  std::unique_ptr<MappedTokens> train_map_, val_map_;
  Buffer train_dev_, val_dev_;
  const std::uint8_t* train_tokens_ = nullptr;
  const std::uint8_t* val_tokens_ = nullptr;
};

/// --task shakespeare: reads the manifest of --data and sets the model's vocabulary to
/// the data's (std::runtime_error saying how to make the files when they are missing).
/// Does nothing for --task synthetic. The Trainer constructor calls it too.
void prepare_task(TrainOptions& options);

/// Throws std::runtime_error for option combinations the library does not offer (--params
/// mxfp8 with --mode fsdp: MXFP8 parameters are DistributedAdam's), saying what to use.
/// The Trainer constructor calls it too.
void check_supported(const TrainOptions& options);

/// The backend a run uses: --backend, or CUDA when this trainer has its CUDA ops, the
/// library has CUDA and a device is visible; else the host backend.
shardopt::Backend choose_backend(const TrainOptions& options);

}  // namespace trainer
