// shardopt/sharded_optimizer.hpp - the public surface the two front ends share
// (DistributedAdam, Fsdp): the layout, this rank's shard of each parameter, the step
// scalars and slots, the microbatch state, checkpoints and the memory report. Both derive
// from ShardedOptimizer, so each of these calls is declared and documented once, here;
// each front end's header has the calls of its own protocol (views, gathers, step).
#pragma once

#include <memory>
#include <string>

#include "shardopt/backend.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/memory_report.hpp"
#include "shardopt/microbatch.hpp"
#include "shardopt/views.hpp"

namespace shardopt {

namespace detail {
class FrontEnd;
class StepTarget;
}  // namespace detail

/// The part of DistributedAdam and Fsdp that is the same in both. Not made on its own
/// (its constructor is the front ends'); on a moved-from front end every call below fails
/// as the front end's other calls do.
class ShardedOptimizer {
 public:
  /// The layout of the parameters (buffers, buckets, this rank's shards).
  const Layout& layout() const;
  /// The backend of the optimizer's communicator.
  Backend backend() const;
  /// Number of parameters (ParamSpecs) registered.
  int num_params() const;
  /// True when parameter i is stored as MXFP8 (param_format Mxfp8 and two or more dims).
  bool is_mxfp8(int i) const;

  /// This rank's piece of parameter i in the parameter storage (write initial values here,
  /// then call init_master). An MXFP8 or NVFP4 parameter has none: Error(InvalidArgument)
  /// (write shard_master(i) and call init_from_master).
  ShardView shard_param(int i) const;
  /// This rank's piece of parameter i's fp32 master (e.g. to seed it, or for checkpoints).
  ShardView shard_master(int i) const;
  /// With AdamOptions::master_storage = bf16_remainder: this rank's piece of parameter i's
  /// 16-bit remainders (u16, parallel to shard_param(i)); the two rebuild the fp32 master
  /// (shardopt/numerics.hpp, num::remainder_join). Empty for a parameter with an fp32 master.
  ShardView shard_remainder(int i) const;
  /// This rank's piece of parameter i's Adam moments (moment_dtype), e.g. for checkpoints;
  /// empty (no elements, no data) for a parameter in a Muon group, which has none.
  ShardView shard_exp_avg(int i) const;
  ShardView shard_exp_avg_sq(int i) const;
  /// This rank's piece of parameter i's reduced gradient in `dtype`: a view when `dtype` is
  /// the gradient storage's dtype, else a cast copy written on `stream` (allocated on first
  /// use; released by zero_grad unless persistent_grad_copies). The hook for external
  /// optimizers. Valid once the gradients are reduced (after reduce_grads / grad_ready).
  ShardView shard_grad(int i, DType dtype, Stream stream);

  /// Learning rate for LrSchedule::Kind::Host: written to a pinned host slot that every
  /// (replayed) step copies to the device.
  void set_lr(float lr);
  /// Loss scale: gradients are divided by it (pinned slot, like set_lr).
  void set_loss_scale(float scale);
  /// Device-resident step values: step count, lr, norm, clip coefficient, found-inf.
  StepScalars* device_scalars() const;
  /// Copies the device scalars to the host after `stream`'s work, waiting as synchronize()
  /// does (refused while `stream` is capturing).
  StepScalars read_scalars(Stream stream) const;
  /// Blocks until the work queued on `stream` so far has finished, within the wait_timeout
  /// of AdamOptions::watchdog (0: no limit). Error(Timeout) when it passes, or once the
  /// step watchdog gave up a replayed iteration (a dead or stuck rank; the communicator
  /// is then aborted and every later call that needs it throws Error(Timeout) too). Use
  /// it instead of a bare stream synchronization where a hang must become an error.
  void synchronize(Stream stream) const;
  /// Device-resident microbatch state (shardopt/microbatch.hpp).
  MicrobatchState* device_microbatch() const;
  /// Advances the device microbatch index on `stream` (index + 1 mod microbatches).
  void advance_microbatch(Stream stream);

  /// Writes a checkpoint of this optimizer into directory `dir` (created if missing; a
  /// checkpoint already there is replaced): per parameter, in model space, the fp32 master,
  /// the moments and the parameter as the trainer sees it (MXFP8 / NVFP4: the stored
  /// format's bytes), plus the step count, the lr slot, the loss scale, the Adam options
  /// and `user` (docs/checkpoints.md). Collective: every rank writes only its own file,
  /// through a small pinned staging buffer; rank 0 writes the index last. Waits for
  /// `stream`'s work first (and for parameter gathers still in flight); not inside a
  /// capture. Error on every rank if any rank fails (the directory then has no index).
  void save(const std::string& dir, Stream stream, const CheckpointUserData& user = {});
  /// The same, without blocking training: the state is copied into pinned host memory on
  /// a side stream (`stream` waits only for that copy) and a background thread writes the
  /// file. Call wait() on the handle (on every rank) to finish it; a later save, load or
  /// destruction of this optimizer waits for it first.
  SaveHandle save_async(const std::string& dir, Stream stream, const CheckpointUserData& user = {});
  /// Loads a checkpoint written by any shardopt optimizer in any layout (other world size,
  /// bucket size, DistributedAdam or Fsdp, grouped or discrete members, bf16 or MXFP8
  /// parameters): each rank reads only the slices it needs, checks every file's checksum,
  /// then writes master and moments into the existing buffers (views and captured graphs
  /// stay valid), sets the step count, lr slot and loss scale, and publishes the
  /// parameters from the master (quantized formats: quantized afresh, as init_from_master
  /// does, so their bytes equal the saving run's bitwise). Collective. Any bad input
  /// (missing or truncated file, checksum mismatch, missing tensor, other shape, newer
  /// format, a directory without an index) is an Error on every rank, and nothing in the
  /// optimizer changes.
  CheckpointInfo load(const std::string& dir, Stream stream);

  /// Bytes per rank by category (each front end's header says what its pools hold).
  MemoryReport memory() const;
  /// Throws Error(CaptureRefused) naming the option to change if capturing a step now
  /// would allocate or free memory inside it (a graph replay would then use freed
  /// pointers). StepGraph calls this.
  void check_capturable() const;

 protected:
  /// Takes the front end's state; `type_name` ("DistributedAdam", "Fsdp") is named by
  /// the errors (a moved-from object, synchronize's timeout).
  ShardedOptimizer(std::unique_ptr<detail::FrontEnd> front, const char* type_name);
  ~ShardedOptimizer();
  ShardedOptimizer(ShardedOptimizer&&) noexcept;
  ShardedOptimizer& operator=(ShardedOptimizer&&) noexcept;
  /// The front end's state (a moved-from object: the error of core/live.hpp).
  detail::FrontEnd& front() const;

 private:
  friend class StepGraph;
  detail::StepTarget& step_target();
  std::unique_ptr<detail::FrontEnd> front_;
  const char* type_name_;
};

}  // namespace shardopt
