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
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "quantized/quantized_params.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/mxfp8_param.hpp"

namespace shardopt::detail {

/// Bytes per element the staged all-gather moves: one rowwise + one columnwise e4m3 byte.
inline constexpr int kMxfp8StagedBytes = 2;

/// Makes the MXFP8 format (QuantizedParams::MakeFormat).
std::unique_ptr<QuantizedFormat> make_mxfp8_format(const FormatContext& ctx);

/// The persistent storage of MXFP8 parameter p (`format` made by make_mxfp8_format).
Mxfp8View mxfp8_view(const QuantizedFormat& format, int param);

}  // namespace shardopt::detail
