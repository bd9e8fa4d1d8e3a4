// shardopt/checkpoint.hpp - what the optimizers' save / load calls take and return
// (DistributedAdam::save, Fsdp::save, ...). The format, a directory of per-rank
// safetensors files in model space plus an index written last, is in docs/checkpoints.md;
// tools/shardopt_ckpt.py reads it from Python.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace shardopt {

/// The trainer's own values saved with a checkpoint (its data position, seed, ...).
using CheckpointUserData = std::map<std::string, std::string>;

/// What load() found besides the tensors.
struct CheckpointInfo {
  std::int64_t step = 0;         ///< optimizer steps applied when it was saved
  int saved_world_size = 0;      ///< ranks (files) of the saving run
  float loss_scale = 1.0f;       ///< the loss scale set then (now set again)
  float lr = 0.0f;               ///< the host learning-rate slot then (now set again)
  CheckpointUserData user;       ///< the map given to save()
  std::string options_json;      ///< the saving run's Adam options, as in index.json
};

namespace detail {
class SaveJob;
}

/// A save in progress (save_async). Move-only; wait() is collective (every rank calls
/// it): it waits for this rank's file, then for every rank, and rank 0 writes the index.
/// An unwaited handle leaves the save to the optimizer that started it: its next save,
/// save_async or load finishes the save first (index included, collectively). If the
/// optimizer is destroyed first, it waits for this rank's file but writes no index (the
/// directory then stays an incomplete checkpoint, which load refuses) and a later wait()
/// is Error(InvalidState).
class SaveHandle {
 public:
  SaveHandle();
  ~SaveHandle();
  SaveHandle(SaveHandle&&) noexcept;
  SaveHandle& operator=(SaveHandle&&) noexcept;
  /// Blocks until the checkpoint is complete on disk (collective). Rethrows an error of
  /// the background write, on every rank. A second wait() is a no-op.
  void wait();
  /// True once wait() has returned, or for a handle that holds no save.
  bool done() const noexcept;

  /// Internal: the library makes handles.
  explicit SaveHandle(std::shared_ptr<detail::SaveJob> job);

 private:
  std::shared_ptr<detail::SaveJob> job_;
};

}  // namespace shardopt
