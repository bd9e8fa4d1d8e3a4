// shardopt/distributed_adam.hpp - distributed Adam/AdamW (ZeRO-1/2) over bucketed,
// sharded buffers, with persistent views and a step that captures in a CUDA graph.
//
// The optimizer owns the flat parameter and gradient buffers (BucketStore); fp32 master
// weights and Adam moments exist only for this rank's shard. A trainer takes its
// ParamView / GradView objects once and writes gradients straight into the grad views.
//
//   step(stream): finish the bucket reduce-scatters (those not started by grad_ready),
//   global grad norm (shard partial sums + one all-reduce, on the device), found-inf
//   across ranks, clipping, fused Adam on the shard writing master and param slices,
//   then the per-bucket parameter all-gather (or deferred: wait_param before use).
//
// Nothing in a step reads device data on the host, allocates, or depends on a host
// value that changes between steps: learning rate and loss scale come from pinned host
// slots copied by the (captured) step, or from a device-side schedule.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/memory_report.hpp"
#include "shardopt/microbatch.hpp"
#include "shardopt/param_spec.hpp"
#include "shardopt/schedule.hpp"
#include "shardopt/views.hpp"

namespace shardopt {

/// Options of a DistributedAdam.
struct DistributedAdamOptions {
  /// When set, every parameter is stored in this dtype (bf16, f16 or f32) whatever its
  /// ParamSpec says.
  std::optional<DType> param_dtype;
  /// Gradient buffer dtype: f32 = fp32 main grads; bf16 / f16 = decoupled grads that the
  /// fused Adam reads directly.
  DType grad_dtype = DType::f32;
  /// Bucket threshold in elements (unset: layout default).
  std::optional<std::int64_t> bucket_numel;
  /// Global-norm clipping threshold; 0 disables clipping (the norm is still computed).
  float clip_max_norm = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  /// true: AdamW (decoupled decay); false: Adam with L2 added to the gradient.
  bool decoupled_weight_decay = true;
  /// Hyper-parameters of groups not listed in `groups`.
  AdamGroup default_group{};
  /// Per optimizer-group hyper-parameters, by ParamSpec::group name.
  std::map<std::string, AdamGroup> groups;
  /// grad_ready() starts a bucket's reduce-scatter as soon as its last param reports.
  bool overlap_grad_reduce = true;
  /// step() leaves the parameter all-gathers in flight; call wait_param(bucket, stream)
  /// before the next forward reads the bucket (eager mode only; a captured step waits).
  bool overlap_param_gather = false;
  /// Reduction of the gradient reduce-scatter.
  ReduceOp grad_reduce = ReduceOp::Average;
  /// Launch the reduce-scatters that step() starts, and the all-gathers, as one NCCL group
  /// instead of one call per bucket (fewer launches; bench_comm measures both).
  bool grouped_collectives = true;
  /// Pipeline the end of step(): the buckets are split into this many consecutive groups;
  /// a group's all-gather starts as soon as Adam has updated it, overlapping the Adam pass
  /// of the next group. 1 = Adam on the whole shard, then the gathers.
  int gather_pipeline = 4;
  /// CUDA: ncclMemAlloc + registration of the flat buffers (false: cudaMalloc).
  bool nccl_registered = true;
  /// Dtype of the Adam moments: f32, or bf16 (half the memory, see fused_adam.hpp).
  DType moment_dtype = DType::f32;
  /// Where each step's learning rate comes from.
  LrSchedule lr_schedule = LrSchedule::host();
  /// Graph mode for cast copies made by shard_grad(): they persist across zero_grad so
  /// captured pointers stay valid (their bytes are reported under `copies`). Without it
  /// zero_grad releases them, and capturing such a step is refused.
  bool persistent_grad_copies = false;
  /// Microbatches per step (the size of the device microbatch counter).
  int microbatches = 1;
};

/// Distributed Adam over a BucketStore. Move-only.
class DistributedAdam {
 public:
  /// Collective over `comm`: checks that every rank has the same layout (a clear
  /// Error(LayoutMismatch) otherwise), allocates, and zeroes params, grads and moments.
  DistributedAdam(Communicator comm, std::vector<ParamSpec> specs, DistributedAdamOptions options = {});
  ~DistributedAdam();
  DistributedAdam(DistributedAdam&&) noexcept;
  DistributedAdam& operator=(DistributedAdam&&) noexcept;

  const Layout& layout() const noexcept;
  const Communicator& comm() const noexcept;
  const DistributedAdamOptions& options() const noexcept;
  Backend backend() const noexcept;
  int num_params() const noexcept;
  int param_index(const std::string& name) const;

  /// Persistent views of the whole parameter / gradient (identical on every call).
  ParamView param(int i) const;
  GradView grad(int i) const;
  /// Views of member m of a grouped parameter.
  ParamView member_param(int i, int m) const;
  GradView member_grad(int i, int m) const;
  /// This rank's piece of parameter i in the param buffer / in the fp32 master.
  ShardView shard_param(int i) const;
  ShardView shard_master(int i) const;
  /// This rank's piece of parameter i's Adam moments (moment_dtype), e.g. for checkpoints.
  ShardView shard_exp_avg(int i) const;
  ShardView shard_exp_avg_sq(int i) const;
  /// This rank's piece of parameter i's reduced gradient in `dtype`: a view of the grad
  /// buffer when `dtype` is the buffer's dtype, else a cast copy written on `stream`
  /// (allocated on first use; released by zero_grad unless persistent_grad_copies).
  /// The hook for external optimizers. Valid after reduce_grads() on the same stream.
  ShardView shard_grad(int i, DType dtype, Stream stream);

  /// Seeds the fp32 master from this rank's param slices, then all-gathers the params so
  /// every rank holds the owners' values. Call once after writing initial params.
  void init_master(Stream stream);
  /// Reports that param i's gradient is complete on `stream` (overlap with backward).
  /// A no-op while grad sync is off or overlap_grad_reduce is false.
  void grad_ready(int i, Stream stream);
  /// Turns grad_ready() on or off (off for microbatches that only accumulate).
  void set_grad_sync(bool enabled) noexcept;
  bool grad_sync() const noexcept;
  /// Starts the reduce-scatters not yet started and makes `stream` wait for all of them.
  /// A later step() then does not reduce again (until the next step or zero_grad).
  void reduce_grads(Stream stream);
  /// The whole optimizer step (see the file comment); it reduces the gradients first
  /// unless reduce_grads() already did.
  void step(Stream stream);
  /// Starts every bucket's parameter all-gather; waits unless overlap_param_gather.
  void gather_params(Stream stream);
  /// Makes `stream` wait for bucket b's parameter all-gather (a no-op if none pending).
  void wait_param(int bucket, Stream stream);
  /// Zeroes every gradient view in place; releases cast copies unless persistent.
  void zero_grad(Stream stream);

  /// Learning rate for LrSchedule::Kind::Host: written to a pinned host slot that every
  /// (replayed) step copies to the device.
  void set_lr(float lr);
  /// Loss scale: gradients are divided by it (pinned slot, like set_lr).
  void set_loss_scale(float scale);
  /// Device-resident step values: step count, lr, norm, clip coefficient, found-inf.
  StepScalars* device_scalars() const noexcept;
  /// Copies the device scalars to the host after `stream`'s work (synchronizes; refused
  /// while `stream` is capturing).
  StepScalars read_scalars(Stream stream) const;
  /// Device-resident microbatch state and its advance (index + 1 mod microbatches).
  MicrobatchState* device_microbatch() const noexcept;
  void advance_microbatch(Stream stream);

  /// Bytes per rank by category.
  MemoryReport memory() const;
  /// Throws Error(CaptureRefused) naming the option to change if capturing a step now
  /// would allocate or free memory inside it (seed 004). StepGraph calls this.
  void check_capturable() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardopt
