// shardopt/fsdp.hpp - fully sharded data parallel (ZeRO-3) and hybrid sharding.
//
// Only this rank's shard persists: parameters (param_dtype), gradients (grad_dtype), the
// fp32 master and the Adam moments. The trainer declares units (e.g. layers: contiguous
// runs of parameters in registration order). Before a unit's forward or backward it
// calls wait_param(unit, stream), which gathers the unit into one of two preallocated
// parameter slots and returns views of its parameters there. The order of wait_param
// calls in an iteration is learned on the first iteration (between construction and the
// first step()) and checked on every later one; from the second iteration on, the next
// unit's gather is prefetched into the other slot while the current unit computes.
// Calling wait_param for the next unit releases the previous one (reshard after use);
// with keep_last_unit the last forward unit stays gathered for the first backward unit.
//
// Gradients: grad_slot(unit, stream) hands out zeroed views of the unit's full gradients
// in the one gradient slot; the trainer writes or accumulates them; grad_ready(unit,
// stream) reduce-scatters the slot and adds this rank's part into the persistent
// gradient shard (so microbatches accumulate there), then frees the slot.
//
// Hybrid sharding (shard_group_size < ranks): shard within groups of consecutive ranks,
// replicate across groups; gradients are reduce-scattered inside the shard group and
// all-reduced across replicas.
//
// Views returned by wait_param and grad_slot are the same on every iteration for the
// same position in the learned order, so a whole iteration captures in one CUDA graph
// (StepGraph); nothing in it allocates or reads device data on the host.
//
// MXFP8 parameters (FsdpOptions::param_format = ParamFormat::Mxfp8, docs/mxfp8.md
// "FSDP"): every parameter of two or more dims persists only as this rank's fp32 master
// shard, its moments and its shard of the rowwise and columnwise MXFP8 data (the scales
// whole: the step's scale exchange leaves every rank with them). A unit's forward pass
// gathers only the rowwise plane, its backward pass only the columnwise plane; the
// trainer names the pass (wait_param(unit, pass, stream), mxfp8_param(i, pass)), the
// learned order records it per position, and a later call that names the other pass
// (or a view of the other plane) is an error. GEMMs of a linear layer Y = X W^T (W: [rows, cols] =
// [out, in]): the forward GEMM contracts over cols and reads the rowwise plane (1 x 32
// blocks along a row); the data-gradient GEMM dX = dY W contracts over rows and reads
// the columnwise plane (32 x 1 blocks along a column); the weight-gradient GEMM
// dW = dY^T X reads no weight. Forward planes land in the gradient slot (free during
// forward); backward planes are staged there too, between the previous unit's
// grad_ready and this unit's grad_slot, and copied into one columnwise slot;
// grad_slot zeroes whatever staging the gradient slot held before it hands out views.
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
#include "shardopt/param_spec.hpp"
#include "shardopt/schedule.hpp"
#include "shardopt/sharded_optimizer.hpp"
#include "shardopt/views.hpp"

namespace shardopt {

/// A unit gathered as one piece: `count` parameters starting at registration index `first`.
struct FsdpUnit {
  std::string name;
  int first = 0;
  int count = 0;
};

/// Which pass of an iteration a wait_param call serves. The learning iteration records
/// the pass the trainer names at each position (a backward that needs no weights may
/// skip its call); later iterations must name the same pass there. The pass-less
/// wait_param (native parameters) takes a unit's calls as alternating Forward, Backward.
enum class FsdpPass { Forward, Backward };

/// One plane of a gathered MXFP8 parameter (Fsdp::mxfp8_param): the rowwise plane in
/// forward, the columnwise plane in backward. Valid on the stream of the wait_param
/// that gathered it until the next wait_param after it (the place is then reused).
struct Mxfp8PassView {
  Mxfp8Shape shape;            ///< G members of [rows, cols]
  FsdpPass pass = FsdpPass::Forward;
  Mxfp8Plane plane = Mxfp8Plane::Rowwise;  ///< Rowwise for Forward, Columnwise for Backward
  const std::uint8_t* data = nullptr;      ///< e4m3, [G, rows, cols] (the gathered plane)
  /// e8m0 scales of that plane (compact, unswizzled): rowwise [G*rows, ceil(cols/32)],
  /// columnwise [G*ceil(rows/32), cols]; persistent (the step's exchange made them whole).
  const std::uint8_t* scales = nullptr;
  /// Device table of shape.members entries (offsets relative to data and scales).
  const Mxfp8Member* members = nullptr;
};

/// Bytes of parameter all-gathers this rank has issued (Fsdp::gather_stats), per pass:
/// count_per_rank x element size x shard group size of every all_gather call.
struct FsdpGatherStats {
  std::int64_t calls = 0;
  std::int64_t forward_bytes = 0;   ///< gathers for Forward positions
  std::int64_t backward_bytes = 0;  ///< gathers for Backward positions
  std::int64_t mxfp8_bytes = 0;     ///< of these, MXFP8 plane bytes (one plane per pass)
};

/// Options of an Fsdp optimizer: the Adam settings (AdamOptions: betas, eps, groups,
/// clipping, moment dtype, schedule, microbatches) and the FSDP ones below.
struct FsdpOptions : AdamOptions {
  /// Storage dtype of every parameter (shard and gathered slots). Every ParamSpec of a
  /// parameter stored so (with Mxfp8: those not quantized) must have this dtype: the
  /// constructor refuses one that differs, on every rank, with Error(InvalidArgument).
  DType param_dtype = DType::bf16;
  /// Persistent gradient shard: bf16 / f16, or f32 (fp32 accumulation across microbatches).
  DType grad_dtype = DType::bf16;
  /// Dtype of the gradient slot the trainer writes (the reduce-scatter runs in it).
  DType slot_grad_dtype = DType::bf16;
  /// Bucket threshold inside a unit (unset: layout default); a unit is one or more buckets.
  std::optional<std::int64_t> bucket_numel;
  ReduceOp grad_reduce = ReduceOp::Average;
  /// How grad_ready reduces the slot (docs/grad_reduce.md). Native: the backend's
  /// reduce-scatter in slot_grad_dtype (then, with replicas, its all-reduce). F32Accumulate:
  /// an all-to-all of the slot's pieces in slot_grad_dtype (the bytes of a reduce-scatter),
  /// one fp32 sum per element in shard-rank order (divided once for Average); with
  /// replicas, an fp32 all-gather of those sums across the replica group and a second fp32
  /// sum in replica order (divided once for Average); the result is added once, in fp32,
  /// into the gradient shard, which Adam reads (grad_dtype f32 keeps it unrounded). The
  /// same bits on every run, NCCL algorithm and backend. Costs a receive buffer of one
  /// bucket (plus replicas x a bucket's shard in fp32), allocated at construction and
  /// counted in MemoryReport::grads.
  GradReducePrecision grad_reduce_precision = GradReducePrecision::Native;
  /// Keep a unit gathered when the learned order asks for it twice in a row (the last
  /// forward unit is the first backward unit): no reshard, no regather.
  bool keep_last_unit = true;
  /// Prefetch the next unit's gather while the current unit computes (from the second
  /// iteration on); false gathers each unit when wait_param asks for it.
  bool prefetch = true;
  /// Ranks per shard group; 0 = all ranks (FSDP). Must divide the number of ranks.
  int shard_group_size = 0;
  /// Cast copies made by shard_grad persist across zero_grad (graph mode).
  bool persistent_grad_copies = false;
  /// Native (param_dtype everywhere) or Mxfp8: parameters of two or more dims become
  /// MXFP8 (one plane gathered per pass; the 1-D ones stay param_dtype). Nvfp4 is
  /// Error(Unsupported). With Mxfp8 the trainer seeds shard_master(i) and calls
  /// init_from_master, and names the pass in wait_param.
  ParamFormat param_format = ParamFormat::Native;
};

/// Fully sharded data parallel with a fused Adam on the shard. Move-only: a moved-from
/// optimizer may only be destroyed or assigned to; its other calls throw
/// Error(InvalidState). The calls it shares with DistributedAdam (shard views, scalars,
/// checkpoints, memory) are ShardedOptimizer's: shardopt/sharded_optimizer.hpp. Here
/// memory() counts the persistent shard, the moments and the pool (two param slots, one
/// grad slot; with MXFP8 one columnwise slot, and `mxfp8` = the shard planes + whole
/// scales; docs/mxfp8.md); shard_param(i) is the parameter shard (the pieces
/// init_master reads).
class Fsdp : public ShardedOptimizer {
 public:
  /// Collective over `comm`. Checks that every rank passes the same options (every field
  /// above but persistent_grad_copies: Error(LayoutMismatch) on every rank naming the first
  /// that differs and each rank's value), that the specs' dtypes are param_dtype
  /// (Error(InvalidArgument) on every rank naming the parameter, both dtypes and the
  /// option), the units (contiguous, covering every parameter once) and that every rank
  /// has the same layout; allocates the shard, the moments and the pool.
  Fsdp(Communicator comm, std::vector<ParamSpec> specs, std::vector<FsdpUnit> units, FsdpOptions options = {});
  ~Fsdp();
  Fsdp(Fsdp&&) noexcept;
  Fsdp& operator=(Fsdp&&) noexcept;

  /// The options as passed to the constructor.
  const FsdpOptions& options() const;
  /// The number of units (the constructor's `units`), each gathered and freed as a whole.
  int num_units() const;
  /// The unit that holds parameter `param` (its index in the specs); Error(OutOfRange)
  /// outside [0, number of parameters).
  int unit_of(int param) const;
  /// This rank within its shard group, the shard group size, and the number of replicas.
  int shard_rank() const;
  int shard_size() const;
  int replicas() const;

  /// Gathers unit `unit` (or waits for its prefetched gather) and returns views of its
  /// parameters, in registration order. `stream` reads them only after the gather.
  /// With MXFP8 parameters use the overload that names the pass (Error(InvalidArgument)).
  std::vector<ParamView> wait_param(int unit, Stream stream);
  /// The same for pass `pass` (Error(InvalidArgument) when the learned order has the
  /// other pass at this position: a unit's first call of an iteration is its Forward).
  /// MXFP8 parameters get a view with null data (their dtype e4m3): read them with
  /// mxfp8_param(i, pass); the gather moved only that pass's plane.
  std::vector<ParamView> wait_param(int unit, FsdpPass pass, Stream stream);
  /// The plane of MXFP8 parameter i gathered by its unit's last wait_param, which must
  /// have been for `pass` (Error(InvalidArgument) naming the plane otherwise; a native
  /// parameter or a unit not gathered yet: Error(InvalidArgument) / Error(InvalidState)).
  Mxfp8PassView mxfp8_param(int i, FsdpPass pass) const;
  /// Ends a forward-only pass (evaluation) without backward or step: `stream` waits for
  /// the gathers still prefetched, and the next wait_param starts an iteration. Before
  /// the order is learned it forgets the calls so far. Error(InvalidState) after a
  /// Backward wait_param or while a unit holds the gradient slot.
  void end_forward_only(Stream stream);
  /// Where the gradient slot's MXFP8 staging region `half` (0 or 1) stands: InFlight
  /// (a plane is gathered into it), Landed (its bytes may be read), Consumed (read; not
  /// zeroed yet), Idle (zero, or never written). grad_slot zeroes every region that is
  /// not Idle before it hands out gradient views, so a backward
  /// accumulates into zeros, never into bytes a gather left in the slot.
  GatherState staging_state(int half) const;
  /// Parameter all-gather bytes issued by this rank so far, per pass.
  FsdpGatherStats gather_stats() const;
  /// Zeroed views of unit `unit`'s full gradients (registration order) in the gradient
  /// slot; `stream` first waits until the slot is free.
  std::vector<GradView> grad_slot(int unit, Stream stream);
  /// Reduce-scatters the gradient slot into the persistent shard and frees the slot.
  void grad_ready(int unit, Stream stream);
  /// Norm, clipping, Adam on the shard (the next gathers read the new params).
  void step(Stream stream);
  /// Zeroes the persistent gradient shard; releases cast copies unless persistent.
  void zero_grad(Stream stream);

  /// Seeds the fp32 master from the parameter shard. Until init_master or load has run,
  /// step(), wait_param() and grad_ready() throw Error(InvalidState).
  void init_master(Stream stream);
  /// The other way round, for any format: publishes the fp32 values written into the
  /// shard_master(i) pieces (native shards converted, MXFP8 shards quantized: one scale
  /// Max all-reduce over the shard group). Collective. The way to seed MXFP8 parameters
  /// (init_master is Error(InvalidState) with them).
  void init_from_master(Stream stream);

  /// The stream the parameter gathers run on (nullptr on the host backend); exposed so
  /// that tests can delay it and prove the compute stream never reads a slot early.
  Stream gather_stream() const;
  /// The learned order of units (empty until the first step()).
  const std::vector<int>& unit_order() const;

  class Impl;

 private:
  Impl& impl() const;  // the state, through ShardedOptimizer::front()
};

}  // namespace shardopt
