// shardopt/mxfp8_param.hpp - what a trainer sees of an MXFP8 parameter kept by an
// optimizer (DistributedAdamOptions::param_format = ParamFormat::Mxfp8): its persistent
// storage and where its bucket's parameter all-gather stands (docs/mxfp8.md).
#pragma once

#include "shardopt/mxfp8.hpp"

namespace shardopt {

/// Where a bucket's parameter all-gather stands (DistributedAdam::gather_state). For an
/// MXFP8 bucket the gather lands in its gradient region; the only legal sequence is
/// Idle -> InFlight (quantized, all-gather dispatched) -> Landed (the caller's stream
/// waited for it) -> Consumed (bytes copied into the MXFP8 storage and the region
/// zeroed) -> Idle, and every path that could let a backward see the staging bytes
/// drives the bucket to Idle first (docs/mxfp8.md). Native buckets report InFlight while
/// a deferred all-gather is pending, else Idle.
enum class GatherState { Idle, InFlight, Landed, Consumed };

/// An MXFP8 parameter's persistent storage (never moves; valid for the optimizer's life).
struct Mxfp8View {
  Mxfp8Shape shape;  ///< G members of [rows, cols]
  /// Rowwise and columnwise e4m3 data ([G, rows, cols] each) and their compact,
  /// unswizzled e8m0 scales, in the backend's device memory.
  Mxfp8Planes planes;
  /// Device table of shape.members entries: member g's data and scales relative to
  /// `planes` (contiguous members), for grouped GEMMs without host-side split sizes per step.
  const Mxfp8Member* members = nullptr;
};

}  // namespace shardopt
