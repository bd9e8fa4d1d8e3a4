// shard_state.hpp - one rank's Adam state over a layout, shared by the sharded
// optimizers (DistributedAdam, Fsdp): per layout buffer the chunk table, the fp32 master
// and the moments of this rank's shard; the device step scalars and microbatch state; the
// pinned learning-rate and loss-scale slots; and the device-side step sequence.
#pragma once

#include <map>
#include <utility>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/memory_report.hpp"
#include "shardopt/microbatch.hpp"
#include "shardopt/schedule.hpp"
#include "shardopt/views.hpp"

namespace shardopt::detail {

/// What the Adam step needs to know, common to the sharded optimizers.
struct AdamHyper {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  bool decoupled_weight_decay = true;
  DType grad_dtype = DType::f32;
  DType moment_dtype = DType::f32;
  AdamGroup default_group{};
  std::map<std::string, AdamGroup> groups;
  float clip_max_norm = 0.0f;
  LrSchedule lr_schedule{};
  int microbatches = 1;
};

/// The Adam hyper-parameters of an optimizer's options (DistributedAdamOptions and
/// FsdpOptions name them alike).
template <class Options>
AdamHyper hyper_of(const Options& o) {
  AdamHyper h;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.decoupled_weight_decay = o.decoupled_weight_decay;
  h.grad_dtype = o.grad_dtype;
  h.moment_dtype = o.moment_dtype;
  h.default_group = o.default_group;
  h.groups = o.groups;
  h.clip_max_norm = o.clip_max_norm;
  h.lr_schedule = o.lr_schedule;
  h.microbatches = o.microbatches;
  return h;
}

/// Checks the hyper-parameters; throws Error(InvalidArgument) naming the bad one.
void validate(const AdamHyper& h);

/// Where this rank's piece of one parameter lives (length 0: none).
struct ParamPiece {
  int buffer = 0;
  std::int64_t param_offset = 0;   ///< first element within the parameter
  std::int64_t shard_offset = 0;   ///< within the buffer's shard (master, moments)
  std::int64_t buffer_offset = 0;  ///< within the full buffer
  std::int64_t length = 0;
};

class ShardState {
 public:
  /// With `shard_addressed` the grads and params bound below are shard-contiguous arrays
  /// (FSDP); otherwise they are the full flat buffers (distributed Adam).
  ShardState(Backend backend, const Layout& layout, int rank, const AdamHyper& hyper, bool shard_addressed);

  /// The gradient and parameter storage of layout buffer `buffer`. `params` null: the
  /// buffer's parameters live in another format (MXFP8); Adam updates only the master.
  void bind(int buffer, const void* grads, void* params);

  /// master <- the bound params of this rank's slices (converted to fp32); buffers bound
  /// without params are left as they are.
  void init_master(Stream stream);
  /// The reverse: the bound params of this rank's slices <- master (rounded to the param
  /// dtype; padding included, where the master is zero). Buffers without params skipped.
  void publish_master(Stream stream);
  /// fp32 master of this rank's shard of buffer `buffer` (shard_numel elements).
  float* master(int buffer) const;
  /// The device-side step: lr (slot or schedule), inverse loss scale, grad norm over the
  /// shard (one Sum all-reduce over `norm_comm` when it has several ranks), found-inf,
  /// clip coefficient, Adam on every buffer (prologue once).
  void step(const Communicator& norm_comm, Stream stream);
  /// The two halves of step(): everything up to and including the Adam prologue, then
  /// the Adam pass over chunks [first, last) of one buffer's chunk table (so that a
  /// caller can all-gather finished buckets while later ones update).
  void begin_step(const Communicator& norm_comm, Stream stream);
  void apply(int buffer, std::size_t first, std::size_t last, Stream stream);
  /// The chunk range [first, last) of bucket `bucket` in its buffer's chunk table.
  std::pair<std::size_t, std::size_t> bucket_chunks(int bucket) const;

  const ParamPiece& piece(int param) const;
  /// This rank's piece of param i in the master / moments.
  ShardView master_view(int param) const;
  ShardView exp_avg_view(int param) const;
  ShardView exp_avg_sq_view(int param) const;

  StepScalars* scalars() const noexcept { return scalars_.as<StepScalars>(); }
  MicrobatchState* microbatch() const noexcept { return microbatch_.as<MicrobatchState>(); }
  void set_lr(float lr) noexcept { slots_.as<float>()[0] = lr; }
  void set_loss_scale(float scale);
  StepScalars read_scalars(Stream stream) const;
  void advance_microbatch(Stream stream);

  /// Adds master, moments and this shard's padding in them to a report.
  void add_memory(MemoryReport& r) const;
  const AdamHyper& hyper() const noexcept { return hyper_; }

 private:
  struct BufferShard {
    std::vector<ShardChunk> chunks;
    DeviceBuffer chunks_dev;
    DeviceBuffer master, exp_avg, exp_avg_sq;
    AdamConfig config;
    ShardPointers ptrs;
    std::int64_t real_numel = 0;
  };
  ShardView piece_view(int param, const DeviceBuffer& buf, DType dtype) const;

  Backend backend_;
  const Layout& layout_;
  int rank_;
  AdamHyper hyper_;
  bool shard_addressed_;
  std::vector<BufferShard> shards_;
  std::vector<ParamPiece> pieces_;
  DeviceBuffer scalars_, microbatch_, slots_, readback_;
};

}  // namespace shardopt::detail
