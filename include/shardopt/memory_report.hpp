// shardopt/memory_report.hpp - bytes per rank by category.
#pragma once

#include <cstdint>
#include <string>

namespace shardopt {

/// Bytes held by one rank, by what they hold. Categories are disjoint except `padding`,
/// which says how much of params + grads + master + remainders + moments is layout
/// padding (the only overhead the layout adds).
struct MemoryReport {
  std::int64_t params = 0;        ///< model-parameter buffers (full, or shard + pool for FSDP)
  std::int64_t grads = 0;         ///< gradient buffers
  std::int64_t master = 0;        ///< fp32 master shard
  /// 16-bit remainders that complete bf16 parameters to their fp32 master (2 bytes per
  /// element of the shard, in place of `master`'s 4: AdamOptions::master_storage)
  std::int64_t remainders = 0;
  std::int64_t moments = 0;       ///< Adam moments of the shard (none for Muon pieces) and Muon's momentum
  /// fp32 scales of 8-bit moments (moment_dtype q8_block): one per kMomentBlock elements of each moment
  std::int64_t moment_scales = 0;
  std::int64_t copies = 0;        ///< cast copies made for external optimizers
  std::int64_t pool = 0;          ///< transient gather/grad slots (FSDP)
  std::int64_t mxfp8 = 0;         ///< MXFP8 parameter storage (data + scales)
  std::int64_t nvfp4 = 0;         ///< NVFP4 parameter storage (data, scales, amaxes, exchange buffers)
  std::int64_t nccl_overhead = 0; ///< allocator rounding of ncclMemAlloc'd buffers
  std::int64_t padding = 0;       ///< part of params + grads + master + moments that is padding
  /// Device ring of staging slots that offloaded state streams through each step
  /// (AdamOptions::offload_fraction; docs/offload.md); in total()
  std::int64_t offload_staging = 0;
  /// Optimizer state kept in pinned host memory (AdamOptions::offload_fraction): master or
  /// remainders, moments and scales of the offloaded buckets. Host memory: not in total(),
  /// nor in master / remainders / moments / moment_scales, which count device memory only
  std::int64_t offloaded = 0;

  /// Device bytes: the sum of all categories except padding (already inside them) and
  /// offloaded (host memory).
  std::int64_t total() const noexcept {
    return params + grads + master + remainders + moments + moment_scales + copies + pool + mxfp8 + nvfp4 +
           nccl_overhead + offload_staging;
  }
  /// A multi-line human-readable table.
  std::string to_string() const;
};

}  // namespace shardopt
