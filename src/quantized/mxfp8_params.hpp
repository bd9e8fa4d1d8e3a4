// mxfp8_params.hpp - the MXFP8 format of a DistributedAdam's quantized parameters
// (ParamFormat::Mxfp8; QuantizedParams drives it, docs/mxfp8.md).
//
// Storage: one allocation. First, per MXFP8 parameter, its rowwise then its columnwise
// e4m3 data ([G, rows, cols] each); then the scales, bucket by bucket in bucket order,
// and inside a bucket parameter by parameter (rowwise then columnwise scale tensor), so
// that the scale bytes of any run of consecutive buckets are one contiguous span: one
// e8m0 Max all-reduce exchanges them (scheme A of shardopt/mxfp8.hpp). Every piece
// starts on a 16-byte boundary; the gaps stay zero (and zero is neutral for Max).
//
// Staging: bucket b's gradient region (S = bucket elements / world) holds, for rank r,
// [S rowwise bytes | S columnwise bytes] at byte r * 2S; rank r's phase 2 writes its
// segments there (where its own reduced gradients were, which Adam has consumed), then
// one in-place all-gather of 2S bytes per rank (BucketStoreOptions::staged_gather_bytes
// = 2) moves both planes. Landing copies each rank piece of each parameter into the
// storage.
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

/// Bytes per element the staged all-gather moves: one rowwise + one columnwise e4m3 byte.
inline constexpr int kMxfp8StagedBytes = 2;

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
