// nvfp4_params.hpp - the NVFP4 format of a DistributedAdam's quantized parameters
// (ParamFormat::Nvfp4; QuantizedParams drives it; docs/nvfp4.md, "Parameters of a
// DistributedAdam").
//
// Each member of a parameter (the parameter itself when it is not grouped) is one NVFP4
// tensor of shardopt/nvfp4.hpp: rowwise E2M1 data, E4M3 16 x 16 block scales, fp32 amax
// and decode scale. No columnwise plane is stored (its scales are the same bytes, its
// codes the same codes reordered).
//
// Storage: one allocation. Per parameter its data (member after member, data_bytes()
// each); then the u32 exchange buffers (amax_numel() per member), bucket by bucket, so
// that a run of consecutive buckets exchanges in one u32 Max all-reduce; then per
// parameter its scales, amaxes and decode scales (member after member). Every piece
// starts on a 16-byte boundary; the gaps stay zero (and zero is neutral for Max).
//
// Staging: rank r's slice of bucket b's gradient region holds, in the order of r's
// segments of the bucket, the data bytes of each of its member pieces
// (nvfp4_shard_bytes of the piece's member range), packed. The slice is
// staging_rank_bytes[b] = the largest such sum over the ranks: half a byte per element,
// plus one byte per piece with an odd end. Landing copies each piece's bytes into the
// storage; a byte two ranks share (an odd boundary inside a member) is the OR of their
// two staged bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/adam/adam_math.cuh"
#include "quantized/quantized_params.hpp"
#include "shardopt/nvfp4_param.hpp"

namespace shardopt::detail {

/// Per bucket, the bytes per rank of its staged all-gather (0 for buckets of the
/// buffers not marked in `quantized`): BucketStoreOptions::staged_gather_rank_bytes.
std::vector<std::int64_t> nvfp4_staged_rank_bytes(const Layout& layout, const std::vector<bool>& quantized);

/// Makes the NVFP4 format (QuantizedParams::MakeFormat).
std::unique_ptr<QuantizedFormat> make_nvfp4_format(const FormatContext& ctx);

/// Where the Adam pass emits NVFP4 parameter p's partial amaxes (its u32 exchange
/// buffers, member after member, and its member grid; `first` 0), or nullopt when p is
/// not an NVFP4 parameter (issue 29: Adam emits what phase 1 would write).
std::optional<kernels::AdamAmaxChunk> nvfp4_adam_amax(const QuantizedFormat& format, int param);

/// The persistent storage of NVFP4 parameter p (`format` made by make_nvfp4_format).
Nvfp4View nvfp4_view(const QuantizedFormat& format, int param);

}  // namespace shardopt::detail
