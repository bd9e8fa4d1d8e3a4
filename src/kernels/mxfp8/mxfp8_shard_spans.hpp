// mxfp8_shard_spans.hpp - internal: the scale memory of a list of sharded MXFP8 entries
// as few contiguous byte spans as its layout allows (one memset each before phase 1),
// shared by Mxfp8ShardBatch and the fused Adam pass (adam_mxfp8.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/mxfp8/mxfp8_launch.hpp"

namespace shardopt::mxfp8 {

/// Both scale tensors of every entry, sorted by address and merged where they touch.
std::vector<std::pair<std::uint8_t*, std::size_t>> merged_scale_spans(const std::vector<ShardEntry>& entries);

}  // namespace shardopt::mxfp8
