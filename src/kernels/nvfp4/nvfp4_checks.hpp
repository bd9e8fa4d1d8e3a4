// nvfp4_checks.hpp - internal: the pointer checks the NVFP4 entry points share
// (nvfp4.cpp, nvfp4_shard.cpp, nvfp4_batch.cpp, nvfp4_shard_batch.cpp).
#pragma once

#include <string>

#include "shardopt/nvfp4.hpp"

namespace shardopt::nvfp4 {

/// Throws Error(InvalidArgument) naming `what` when `p` is null.
void require_ptr(const void* p, const std::string& what);
/// require_ptr of the scale plane and the two fp32 values.
void require_scale_planes(const Nvfp4Planes& out);
/// require_ptr of the four outputs.
void require_planes(const Nvfp4Planes& out);
/// The checks of a sharded call: the shape, the range inside it (Error(OutOfRange)), a
/// master for a non-empty range, the amax buffer.
void require_shard(const Nvfp4Shape& shape, Range range, const float* master, const void* amax);
/// The outputs of phase 2: the scale and the two fp32 values, and out.data for a
/// non-empty range.
void require_shard_planes(const Nvfp4Planes& out, Range range);

}  // namespace shardopt::nvfp4
