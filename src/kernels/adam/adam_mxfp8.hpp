// adam_mxfp8.hpp - internal: the fused Adam step of MXFP8 shards (issue 29). Adam
// updates the elements of the whole tile rows of each tensor's range (its "owned
// bands": ShardEntry::owned_begin..owned_end, contiguous in the shard) tile by tile and,
// while the new masters are in registers, writes their amaxes, scale bytes and both
// data planes: the bytes quantize_mxfp8_shard_owned_batch writes from the master Adam
// wrote, without reading the master again. Every other element of the ranges keeps the
// plain path: adam_step_apply over adam_mxfp8_plain_chunks BEFORE this pass (the pass
// reads those new masters for the partial scales of the boundary tile rows), and
// quantize_mxfp8_shard_rest_batch after the exchange. docs/mxfp8.md, "Adam quantizes
// the owned tiles".
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/adam/adam_launch.hpp"
#include "kernels/mxfp8/mxfp8_launch.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/mxfp8.hpp"

namespace shardopt::kernels {

/// Where one tensor's range keeps its Adam state: element range.begin is at shard index
/// shard_offset (master) and buffer index buffer_offset (gradients); its moments at
/// shard index - moment_shift (ShardChunk::moment_shift: compact moments).
struct AdamMxfp8Place {
  std::int64_t shard_offset = 0;
  std::int64_t buffer_offset = 0;
  std::int64_t moment_shift = 0;  ///< as ShardChunk::moment_shift, for every element of the range
  std::int32_t group = 0;   ///< optimizer group (AdamConfig::groups)
  std::int32_t vec_ok = 0;  ///< set by AdamMxfp8Pass: whole tiles may use 16-byte Adam accesses
};

/// The owned bands of a list of tensors' ranges as Adam chunks (shard and buffer
/// offsets, length, group), in the order of the list; empty bands left out.
std::vector<ShardChunk> adam_mxfp8_owned_chunks(const std::vector<Mxfp8ShardTensor>& tensors,
                                                const std::vector<AdamMxfp8Place>& places);

/// `pieces` (chunks of a shard in shard order, as split_shard_chunks takes them) without
/// the elements of `bands` (owned chunks, in shard order): what plain Adam still updates.
std::vector<ShardChunk> adam_mxfp8_plain_chunks(const std::vector<ShardChunk>& pieces,
                                                const std::vector<ShardChunk>& bands);

/// The fused pass of one list of tensors, bound at construction to one shard's Adam
/// state (config, pointers, scalars) and to the tensors' outputs. Built once (validates,
/// uploads, waits; not under capture); each call is capturable, allocates nothing and
/// never waits on the host.
class AdamMxfp8Pass {
 public:
  /// tensors: as for Mxfp8ShardBatch; places: one per tensor. config.write_params must be
  /// false (MXFP8 buffers keep no bf16 parameters), tensor i's master must be
  /// shard.master + places[i].shard_offset, and every owned band must lie inside the
  /// shard (Error(InvalidArgument) otherwise, and for whatever adam_step_apply refuses).
  AdamMxfp8Pass(const std::vector<Mxfp8ShardTensor>& tensors, const std::vector<AdamMxfp8Place>& places,
                const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars, Backend backend);
  ~AdamMxfp8Pass();
  AdamMxfp8Pass(AdamMxfp8Pass&&) noexcept;
  AdamMxfp8Pass& operator=(AdamMxfp8Pass&&) noexcept;

  /// The owned bands (adam_mxfp8_owned_chunks of the tensors).
  const std::vector<ShardChunk>& bands() const;
  /// Tiles of the one launch (those of every tile row holding an element of a range).
  std::int64_t tiles() const;

  /// Zeroes the scale tensors, then in one launch: Adam over the owned bands (nothing
  /// written there on a skipped step: found_inf) and, from the new masters (the masters
  /// as they are on a skipped step), every byte quantize_mxfp8_shard_owned_batch writes.
  /// The host backend runs the composition itself: Adam over the bands, then the owned
  /// pass (its twin).
  void run(Stream stream) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// CUDA (mxfp8_shard.cu): the fused launch over `count` device entries and places.
void launch_adam_mxfp8_owned(const AdamVariant& v, const AdamApplyParams& a, const mxfp8::ShardEntry* entries,
                             const AdamMxfp8Place* places, int count, std::int64_t tiles, Stream stream);

}  // namespace shardopt::kernels
