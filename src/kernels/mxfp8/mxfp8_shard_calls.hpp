// mxfp8_shard_calls.hpp - the per-tensor sharded MXFP8 quantize calls (the two exact
// schemes of shardopt/mxfp8.hpp, one tensor per call). The library and trainers use the
// batches (Mxfp8ShardBatch: one launch per phase for many tensors); these remain for the
// tests, which check the batches against them, and for the benchmark's comparison.
#pragma once

#include <cstdint>

#include "shardopt/backend.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/range.hpp"

namespace shardopt {

/// Scheme (A), phase 1: writes to the full scale tensors the scale byte of this rank's
/// partial amax of every block that `range` touches (bf16(master) over the block's
/// elements inside the range) and 0x00 everywhere else. The master value of element i
/// (flat index in [range.begin, range.end)) is master[i - range.begin]. Next, all-reduce
/// both scale tensors with Max over the ranks (8-bit unsigned).
void mxfp8_partial_scales(const Mxfp8Shape& shape, Range range, const float* master,
                          std::uint8_t* scale_row, std::uint8_t* scale_col, Backend backend,
                          Stream stream);

/// Scheme (A), phase 2 (and the second half of scheme (B)): from the combined scale
/// tensors, writes the rowwise and columnwise data bytes of the elements in `range`
/// only (data_row[i], data_col[i] for i in the range; nothing else is touched).
void quantize_mxfp8_shard_data(const Mxfp8Shape& shape, Range range, const float* master,
                               const std::uint8_t* scale_row, const std::uint8_t* scale_col,
                               std::uint8_t* data_row, std::uint8_t* data_col, Backend backend,
                               Stream stream);

/// Scheme (B), phase 1: writes u32 amax buffers covering the whole tensor (amax_row:
/// scale_row_numel() entries, amax_col: scale_col_numel()): for every block that
/// `range` touches, the bit pattern of the non-negative float amax of bf16(master) over
/// the block's elements inside the range (NaN as 0x7FC00000, so an integer Max orders
/// NaN > Inf > finite); 0 for every other block. Next, all-reduce both with Max as u32.
void mxfp8_partial_amax(const Mxfp8Shape& shape, Range range, const float* master,
                        std::uint32_t* amax_row, std::uint32_t* amax_col, Backend backend,
                        Stream stream);

/// Scheme (B), phase 2: from the combined amax buffers writes the scale byte of EVERY
/// block of the tensor (out.scale_row, out.scale_col) and the data bytes of the
/// elements in `range` only.
void quantize_mxfp8_shard(const Mxfp8Shape& shape, Range range, const float* master,
                          const std::uint32_t* amax_row, const std::uint32_t* amax_col,
                          const Mxfp8Planes& out, Backend backend, Stream stream);

}  // namespace shardopt
