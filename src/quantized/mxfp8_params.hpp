// mxfp8_params.hpp - the MXFP8 format of a DistributedAdam's quantized parameters
// (ParamFormat::Mxfp8; QuantizedParams drives it, docs/mxfp8.md).
//
// Storage: the scales in one allocation, bucket by bucket in bucket order, and inside a
// bucket parameter by parameter (rowwise then columnwise scale tensor), so that the scale
// bytes of any run of consecutive buckets are one contiguous span: one e8m0 Max
// all-reduce exchanges them (scheme A of shardopt/mxfp8.hpp). Every piece starts on a
// 16-byte boundary; the gaps stay zero (and zero is neutral for Max).
//
// Whole storage (DistributedAdam, issue 29): the data in a second allocation laid out by
// bucket: per MXFP8 bucket a rowwise and a columnwise plane of one byte per bucket
// element (padding included, 16-byte aligned). A parameter's data is its bucket's plane
// at its element offset inside the bucket; rank r's slice (S = bucket elements / world)
// is bytes [r S, (r + 1) S) of each plane. The fused pass and phase 2 write this rank's
// slice, and the store all-gathers both planes in place (gather_planes ->
// BucketStore::set_gather_planes): nothing is staged, landed or zeroed, at any world
// size. The allocation is NCCL-registered like the store's buffers (QuantizedParams).
//
// Shard storage (Fsdp, FormatContext::shard_storage): per MXFP8 buffer, this rank's
// shard of the rowwise and of the columnwise data plane (shard_numel bytes each, indexed
// like the fp32 master), then the whole scales as above; phase 2 writes the shard planes
// in place, and Fsdp all-gathers one plane per pass (docs/mxfp8.md, "FSDP").
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/adam/adam_mxfp8.hpp"
#include "quantized/quantized_params.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/mxfp8_param.hpp"

namespace shardopt::detail {

/// Makes the MXFP8 format (QuantizedParams::MakeFormat).
std::unique_ptr<QuantizedFormat> make_mxfp8_format(const FormatContext& ctx);

/// The persistent storage of MXFP8 parameter p (`format` made by make_mxfp8_format).
/// With shard storage (Fsdp) the data pointers are null: only the scales are whole.
Mxfp8View mxfp8_view(const QuantizedFormat& format, int param);

/// Shard storage (FormatContext::shard_storage, Fsdp): this rank's shard of layout
/// buffer `buffer`'s data plane (shard_numel bytes; element k of the shard at byte k).
std::uint8_t* mxfp8_shard_plane(const QuantizedFormat& format, int buffer, Mxfp8Plane plane);

/// Issue 29, "Adam quantizes the owned tiles": builds the fused Adam pass of MXFP8 bucket
/// `bucket` (kernels/adam/adam_mxfp8.hpp) over its parameters' pieces on this rank, bound to
/// the buffer's Adam state (`config`, `shard`: chunks unused, `scalars`) and to `places`
/// (one per parameter of the bucket, in bucket order; a parameter without a piece here
/// takes a default one). Returns the owned bands, which the caller leaves out of Adam's
/// chunks. Construction only (uploads and waits).
std::vector<ShardChunk> mxfp8_fuse_adam(const QuantizedFormat& format, int bucket, const AdamConfig& config,
                                        const ShardPointers& shard, StepScalars* scalars,
                                        const std::vector<kernels::AdamMxfp8Place>& places);

/// The fused pass of `bucket` (mxfp8_fuse_adam ran for it): Adam over its owned bands and
/// phase 1 of the bucket (everything the owned pass writes). Run it after Adam over the
/// bucket's plain chunks, then QuantizedParams::quantize(..., partials_done = true).
void mxfp8_adam_pass(const QuantizedFormat& format, int bucket, Stream stream);

}  // namespace shardopt::detail
