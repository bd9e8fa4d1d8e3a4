// adam_amax.hpp - the fused Adam main pass that also emits the NVFP4 partial amaxes of
// the new master (docs/nvfp4.md, "Adam emits the partial amaxes"): internal, for the
// optimizer's NVFP4 buffers.
#pragma once

#include "kernels/adam/adam_math.cuh"
#include "shardopt/backend.hpp"
#include "shardopt/fused_adam.hpp"

namespace shardopt::kernels {

/// adam_step_apply, and per chunk c with amax[c].amax set, the partial amaxes of the
/// chunk's elements folded into that buffer by an unsigned max (the caller zeroes the
/// buffers first): block entries and the member's range entry, the values
/// nvfp4_partial_amax writes for the same elements. On a skipped step (found_inf) the
/// master is left as it is and the amaxes are those of the master as it is. `amax` has
/// shard.num_chunks entries in the backend's memory; config.write_params must be false
/// (Error(InvalidArgument) otherwise, or when amax is null).
void adam_step_apply_emitting(const AdamConfig& config, const ShardPointers& shard, const AdamAmaxChunk* amax,
                              StepScalars* scalars, Backend backend, Stream stream);

}  // namespace shardopt::kernels
