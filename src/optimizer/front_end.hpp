// front_end.hpp - what ShardedOptimizer (shardopt/sharded_optimizer.hpp) needs from a
// front end's state (DistributedAdam::Impl, Fsdp::Impl): the shard engine, the layout,
// the calls whose rules differ per front end, and the save bookkeeping both keep. The
// shared calls are written once, in sharded_optimizer.cpp, over this interface.
#pragma once

#include <memory>
#include <string>

#include "core/memory.hpp"
#include "optimizer/checkpoint.hpp"
#include "optimizer/shard_engine.hpp"
#include "optimizer/step_target.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/memory_report.hpp"
#include "shardopt/views.hpp"

namespace shardopt::detail {

class FrontEnd : public StepTarget {
 public:
  /// The engine of this rank's shard (master, moments, scalars, views).
  virtual ShardEngine& engine() = 0;
  virtual const Layout& model_layout() const = 0;
  /// The bodies of the public calls of the same meaning (ShardedOptimizer).
  virtual bool stored_mxfp8(int i) const = 0;
  virtual ShardView param_shard(int i) = 0;
  virtual ShardView grad_shard(int i, DType dtype, Stream stream) = 0;
  virtual MemoryReport memory_report() const = 0;
  virtual CheckpointTarget checkpoint_target() = 0;
  /// Makes every parameter current before a checkpoint reads it (gathers in flight
  /// waited for or landed on `stream`). Default: nothing is ever in flight.
  virtual void settle_all(Stream stream) { (void)stream; }
  /// Refuses (Error(InvalidState)) a `call` that publishes the master while the front end
  /// cannot (e.g. its staging holds live gradients). Default: always can.
  virtual void require_publishable(const char* call) const { (void)call; }
  /// Publishes the fp32 master into the parameter storage (every rank; waits).
  virtual void publish_master(Stream stream) = 0;

  std::shared_ptr<SaveJob> last_save;  // the last save_async (a later save waits for it)
  std::shared_ptr<DeviceBuffer> snapshot_pool;  // save_async's pinned snapshot, kept between saves
};

}  // namespace shardopt::detail
