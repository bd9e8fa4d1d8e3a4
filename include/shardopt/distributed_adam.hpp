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
//   MXFP8 parameters (ParamFormat::Mxfp8): Adam writes only the master; each bucket is
//   quantized from it into this rank's slice of the storage and all-gathered there, in
//   place; the step never writes their gradients, which zero_grad clears as native ones
//   (docs/mxfp8.md). NVFP4 parameters (ParamFormat::Nvfp4) are all-gathered through each
//   bucket's own gradient region, landed and the region zeroed (docs/nvfp4.md).
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

#include "shardopt/adam_options.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/memory_report.hpp"
#include "shardopt/microbatch.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/mxfp8_param.hpp"
#include "shardopt/param_format.hpp"
#include "shardopt/nvfp4_param.hpp"
#include "shardopt/param_spec.hpp"
#include "shardopt/schedule.hpp"
#include "shardopt/sharded_optimizer.hpp"
#include "shardopt/views.hpp"

namespace shardopt {

/// Options of a DistributedAdam: the Adam settings (AdamOptions: betas, eps, groups,
/// clipping, moment dtype, schedule, microbatches) and the distributed-Adam ones below.
struct DistributedAdamOptions : AdamOptions {
  /// When set, every parameter is stored in this dtype (bf16, f16 or f32) whatever its
  /// ParamSpec says.
  std::optional<DType> param_dtype;
  /// Gradient buffer dtype: f32 = fp32 main grads; bf16 / f16 = decoupled grads that the
  /// fused Adam reads directly.
  DType grad_dtype = DType::f32;
  /// Bucket threshold in elements (unset: layout default).
  std::optional<std::int64_t> bucket_numel;
  /// grad_ready() starts a bucket's reduce-scatter as soon as its last param reports.
  bool overlap_grad_reduce = true;
  /// step() leaves the parameter all-gathers in flight; call wait_param(bucket, stream)
  /// before the next forward reads the bucket (eager mode only; a captured step waits).
  bool overlap_param_gather = false;
  /// Reduction of the gradient reduce-scatter.
  ReduceOp grad_reduce = ReduceOp::Average;
  /// How the gradient reduce-scatter adds (docs/grad_reduce.md). Native: the backend's
  /// reduce-scatter in grad_dtype (bf16 rounded at every hop, in NCCL's ring or tree
  /// order). F32Accumulate: an all-to-all of each bucket's grad_dtype pieces (the bytes of
  /// a reduce-scatter), then one fp32 sum per element in rank order, divided once for
  /// Average and rounded once to grad_dtype into this rank's slice, which Adam reads: the
  /// same bits on every run and NCCL algorithm. Costs one bucket of scratch (counted in
  /// MemoryReport::grads); the reduce-scatters step() starts run one bucket after another
  /// (no NCCL group).
  GradReducePrecision grad_reduce_precision = GradReducePrecision::Native;
  /// Launch the reduce-scatters that step() starts, and the all-gathers, as one NCCL group
  /// instead of one call per bucket (fewer launches; bench_comm measures both).
  bool grouped_collectives = true;
  /// Pipeline the end of step(): the buckets are split into this many consecutive groups;
  /// a group's all-gather starts as soon as Adam has updated it, overlapping the Adam pass
  /// of the next group. 1 = Adam on the whole shard, then the gathers.
  int gather_pipeline = 4;
  /// CUDA: ncclMemAlloc + registration of the flat buffers (false: cudaMalloc).
  bool nccl_registered = true;
  /// Graph mode for cast copies made by shard_grad(): they persist across zero_grad so
  /// captured pointers stay valid (their bytes are reported under `copies`). Without it
  /// zero_grad releases them, and capturing such a step is refused.
  bool persistent_grad_copies = false;
  /// Native, MXFP8 or NVFP4 parameters (see ParamFormat). With Mxfp8 or Nvfp4,
  /// param_dtype must be unset or f32 (the 1-D parameters' dtype), and the trainer seeds
  /// the parameters through shard_master + init_from_master. Below, MXFP8 and NVFP4
  /// differ only in where the gather goes (MXFP8: into the storage; NVFP4: through the
  /// gradient regions, landed and zeroed); the rest holds for both. A quantized parameter's
  /// gradient is fed as a native one's: in grad_dtype (bf16 or f32, not quantized) into
  /// grad(i), the gradient with respect to the decoded weight.
  ParamFormat param_format = ParamFormat::Native;
};

/// Distributed Adam over a BucketStore. Move-only: a moved-from optimizer may only be
/// destroyed or assigned to; its other calls throw Error(InvalidState). The calls it
/// shares with Fsdp (shard views, scalars, checkpoints, memory) are ShardedOptimizer's:
/// shardopt/sharded_optimizer.hpp. Its save() and load() first land the gathers still in
/// flight.
class DistributedAdam : public ShardedOptimizer {
 public:
  /// Collective over `comm`: checks that every rank passes the same options that change
  /// the math or the collectives (every field above but persistent_grad_copies; an
  /// Error(LayoutMismatch) on every rank names the first that differs and each rank's
  /// value) and has the same layout (Error(LayoutMismatch) naming the first differing
  /// parameter), then allocates, and zeroes params, grads and moments. Per-step values
  /// (set_lr, set_loss_scale) are the trainer's and are not compared. Buffers the device
  /// cannot hold are Error(OutOfMemory) naming the bytes, on the rank that ran out.
  DistributedAdam(Communicator comm, std::vector<ParamSpec> specs, DistributedAdamOptions options = {});
  ~DistributedAdam();
  DistributedAdam(DistributedAdam&&) noexcept;
  DistributedAdam& operator=(DistributedAdam&&) noexcept;

  /// The communicator the optimizer was built on (its collectives run on it).
  const Communicator& comm() const;
  /// The options as passed to the constructor.
  const DistributedAdamOptions& options() const;
  /// The index of the parameter named `name` in the specs' order (what param(i), grad(i)
  /// and the other per-parameter calls take); Error(OutOfRange) for an unknown name.
  int param_index(const std::string& name) const;

  /// Persistent views of the whole parameter / gradient (identical on every call).
  /// param(i) of an MXFP8 / NVFP4 parameter is Error(InvalidArgument): use mxfp8_param(i) /
  /// nvfp4_param(i).
  ParamView param(int i) const;
  GradView grad(int i) const;
  /// Views of member m of a grouped parameter.
  ParamView member_param(int i, int m) const;
  GradView member_grad(int i, int m) const;
  /// The persistent MXFP8 storage of parameter i (Error(InvalidArgument) for a native one).
  /// Its bytes are the step's result once the bucket is Idle (after step(), or after
  /// wait_param in deferred mode).
  Mxfp8View mxfp8_param(int i) const;
  /// True when parameter i is stored as NVFP4 (param_format Nvfp4 and two or more dims).
  bool is_nvfp4(int i) const;
  /// The persistent NVFP4 storage of parameter i (Error(InvalidArgument) for another),
  /// current under the same conditions as mxfp8_param.
  Nvfp4View nvfp4_param(int i) const;

  /// Seeds the fp32 master from this rank's param slices, then all-gathers the params so
  /// every rank holds the owners' values. Call once after writing initial params: until
  /// init_master, init_from_master or load has run, step(), reduce_grads(),
  /// gather_params() and grad_ready() throw Error(InvalidState) (the master is still zero
  /// and a step would overwrite the weights written into the views).
  /// Error(InvalidState) with MXFP8 parameters (they have no param views): use
  /// init_from_master.
  void init_master(Stream stream);
  /// The other way round, for any format: the trainer writes initial fp32 values into its
  /// shard_master(i) pieces, then this publishes them: native buffers get bf16/f16/f32
  /// (master) in their slices and are all-gathered; MXFP8 parameters are quantized and
  /// gathered into their storage (gradients untouched); NVFP4 ones gathered through their
  /// gradient regions, landed and the regions zeroed. Collective; waits (also with
  /// overlap_param_gather). Also the way to publish a master loaded from a checkpoint.
  void init_from_master(Stream stream);
  /// Reports that param i's gradient is complete on `stream` (overlap with backward).
  /// A no-op while grad sync is off or overlap_grad_reduce is false. Error(InvalidState)
  /// naming wait_param while param i's MXFP8 / NVFP4 bucket still has its gather in flight.
  void grad_ready(int i, Stream stream);
  /// Turns grad_ready() on or off (off for microbatches that only accumulate).
  void set_grad_sync(bool enabled);
  bool grad_sync() const;
  /// Starts the reduce-scatters not yet started and makes `stream` wait for all of them.
  /// A later step() then does not reduce again (until the next step or zero_grad).
  void reduce_grads(Stream stream);
  /// The whole optimizer step (see the file comment); it reduces the gradients first
  /// unless reduce_grads() already did. MXFP8 buckets leave their gradients as the
  /// reduce-scatter left them, as native ones (call zero_grad before the next backward);
  /// NVFP4 buckets leave their gradient regions zero (the staging is zeroed on landing).
  /// Either may be left in flight (overlap_param_gather, eager). reduce_grads() and
  /// step() are Error(InvalidState) while a quantized bucket is still in flight from the
  /// previous step (call wait_param or zero_grad first).
  void step(Stream stream);
  /// Starts every bucket's parameter all-gather; waits unless overlap_param_gather.
  /// Quantized buckets are requantized from the master and gathered before it returns (a
  /// forced gather, e.g. before saving). MXFP8 ones gather into their storage and leave
  /// the gradients alone. NVFP4 ones are gathered through their gradient regions, landed
  /// and zeroed: with NVFP4 parameters call it only while the gradient buffer holds
  /// nothing of value (after step() or zero_grad(), before the next backward);
  /// Error(InvalidState) between grad_ready / reduce_grads and step.
  void gather_params(Stream stream);
  /// Makes `stream` wait for bucket b's parameter all-gather (a no-op if none pending).
  /// NVFP4 bucket: lands it (copies the bytes into the storage) and zeroes its gradient
  /// region, on `stream`; MXFP8 bucket: only the wait (it gathered into its storage).
  /// With overlap_param_gather the forward must call it before reading the bucket's
  /// weights, and before the backward writes its gradients.
  void wait_param(int bucket, Stream stream);
  /// Zeroes every gradient view in place (MXFP8 ones included); releases cast copies
  /// unless persistent. Pending quantized gathers are consumed first (NVFP4's staging
  /// lives in the gradients). Call it between steps whatever the format.
  void zero_grad(Stream stream);
  /// Debug query: where bucket b's parameter all-gather stands (host-side bookkeeping of
  /// the calls made so far; Idle after every non-deferred or captured step).
  GatherState gather_state(int bucket) const;

  class Impl;

 private:
  Impl& impl() const;  // the state, through ShardedOptimizer::front()
};

}  // namespace shardopt
