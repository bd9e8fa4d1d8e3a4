// checkpoint.hpp - save and load of one rank's shard state in model space, shared by
// both front ends through the engine (docs/checkpoints.md is the format).
//
// Save: every writing rank streams its slices (master, moments, the native parameter or
// the MXFP8 planes, scale shares) into its own safetensors file; then rank 0, having
// learned every file's size and checksum, writes index.json, computing the slice lists of
// all ranks from the layout (every rank computes the same layout). Load: every rank reads
// the index and, in one sequential pass over each file it needs (checksum verified on
// the way), the byte ranges of the slices that overlap its own pieces, whatever layout
// saved them; nothing in the optimizer changes until every rank has read everything.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optimizer/shard_engine.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8_param.hpp"
#include "shardopt/nvfp4_param.hpp"

namespace shardopt::detail {

/// Where the checkpoint reads an MXFP8 parameter's bytes on this rank. The data planes
/// are given as this rank's piece only (the elements of `ShardEngine::piece(p)`, element
/// 0 = the piece's first, indexed like `master_view(p)`), so a front end that keeps whole
/// planes (DistributedAdam) and one that keeps only its shard of them (Fsdp) describe
/// them alike; the scale tensors are whole on every rank in both.
struct Mxfp8CheckpointSource {
  Mxfp8Shape shape;                         ///< G members of [rows, cols]
  const std::uint8_t* row_piece = nullptr;  ///< this rank's piece of the rowwise data (null: no piece)
  const std::uint8_t* col_piece = nullptr;  ///< this rank's piece of the columnwise data (null: no piece)
  const std::uint8_t* scale_row = nullptr;  ///< the whole rowwise scale tensor (all members)
  const std::uint8_t* scale_col = nullptr;  ///< the whole columnwise scale tensor (all members)
};

/// What the checkpoint code needs from a front end.
struct CheckpointTarget {
  Backend backend = Backend::Host;
  const Layout* layout = nullptr;      ///< the shard layout (its world = the ranks with distinct shards)
  ShardEngine* engine = nullptr;
  const Communicator* all = nullptr;   ///< every rank of the optimizer (agreement, barrier)
  int shard_rank = 0;                  ///< this rank in the layout's world
  bool writes_file = true;             ///< false on the replicas of FSDP hybrid sharding after the first
  /// Where MXFP8 parameter p's bytes are on this rank, or nullopt for another (null: none is).
  std::function<std::optional<Mxfp8CheckpointSource>(int)> mxfp8;
  /// The NVFP4 storage of parameter p, or nullopt for another (null: none is).
  std::function<std::optional<Nvfp4View>(int)> nvfp4;
};

/// Writes the checkpoint synchronously (collective over target.all): data goes through
/// one pinned staging buffer of `staging_bytes`, never a host copy of the whole state.
/// The front end has settled its gathers and `stream` holds the state to save.
void save_checkpoint(const CheckpointTarget& target, const std::string& dir, Stream stream,
                     const CheckpointUserData& user, std::size_t staging_bytes = std::size_t{64} << 20);

/// A save_async in progress: the snapshot, the background writer thread, and what the
/// index needs. The front end keeps one (a second save waits for it; destruction of the
/// optimizer joins its thread and orphans it).
class SaveJob;

/// Snapshots the state into pinned host memory on a side stream (`stream` waits for the
/// snapshot, so training may go on at once) and writes the file on a background thread.
/// The job's wait() writes the index (collective). `pool` keeps the pinned snapshot
/// buffer between saves (the previous job must be finished: the front end waits for it).
std::shared_ptr<SaveJob> save_checkpoint_async(const CheckpointTarget& target, const std::string& dir, Stream stream,
                                               const CheckpointUserData& user, std::shared_ptr<DeviceBuffer>& pool);

/// Waits for `job` (collective; a no-op for null or a finished job).
void wait_save(const std::shared_ptr<SaveJob>& job);
/// The optimizer goes away: joins the writer thread; a later wait() is Error(InvalidState).
void orphan_save(const std::shared_ptr<SaveJob>& job) noexcept;

/// The fp32 master of remainder-kept buffers, staged for one checkpoint (checkpoints
/// are model-space: they hold the fp32 master whatever the storage): the constructor
/// rebuilds it on `stream` and waits for it (ShardEngine::stage_master), the destructor
/// frees it unless keep() handed it on (a load: publish_master splits it back).
class StagedMaster {
 public:
  StagedMaster(ShardEngine& engine, Stream stream);
  ~StagedMaster();
  StagedMaster(const StagedMaster&) = delete;
  StagedMaster& operator=(const StagedMaster&) = delete;
  void keep() noexcept { engine_ = nullptr; }

 private:
  ShardEngine* engine_;
};

/// Reads the checkpoint into the engine's master and moments, the step count, the lr
/// slot and the loss scale (collective over target.all). Every rank validates everything
/// first; on any error every rank throws and nothing has changed. The front end then
/// publishes the parameters from the master.
CheckpointInfo load_checkpoint(const CheckpointTarget& target, const std::string& dir, Stream stream);

}  // namespace shardopt::detail
