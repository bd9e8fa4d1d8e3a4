// mxfp8_launch.hpp - internal: the CUDA launch wrappers (mxfp8.cu) and the host twins
// (mxfp8_host.cpp) behind the entry points of shardopt/mxfp8.hpp. Arguments are
// validated by the dispatcher (mxfp8.cpp) before they get here.
#pragma once

#include <cstdint>

#include "shardopt/backend.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8.hpp"

namespace shardopt::mxfp8 {

// ------------------------------------------------------------------ CUDA (mxfp8.cu)

/// Whole-tensor quantize; `table` may be null (contiguous members).
void launch_quantize(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                     const std::int32_t* skip_flag, const Mxfp8Member* table, Stream stream);
/// Partial scale bytes of the blocks `range` touches (the caller zeroed the scales).
void launch_partial_scales(const Mxfp8Shape& shape, Range range, const float* master,
                           std::uint8_t* scale_row, std::uint8_t* scale_col, Stream stream);
/// Partial u32 amaxes of the blocks `range` touches (the caller zeroed the buffers).
void launch_partial_amax(const Mxfp8Shape& shape, Range range, const float* master,
                         std::uint32_t* amax_row, std::uint32_t* amax_col, Stream stream);
/// Scale bytes of every block from combined u32 amaxes.
void launch_scales_from_amax(const Mxfp8Shape& shape, const std::uint32_t* amax_row,
                             const std::uint32_t* amax_col, std::uint8_t* scale_row,
                             std::uint8_t* scale_col, Stream stream);
/// Data bytes of the elements of `range` from the combined scales.
void launch_shard_data(const Mxfp8Shape& shape, Range range, const float* master,
                       const std::uint8_t* scale_row, const std::uint8_t* scale_col,
                       std::uint8_t* data_row, std::uint8_t* data_col, Stream stream);
/// One plane to f32.
void launch_dequantize(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                       const std::uint8_t* scale, float* out, Stream stream);

// ------------------------------------------------------------------ host twins (mxfp8_host.cpp)
// Same results, byte for byte; they run synchronously (the dispatcher enqueues them).

void host_quantize(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                   const Mxfp8Member* table);
void host_partial_scales(const Mxfp8Shape& shape, Range range, const float* master,
                         std::uint8_t* scale_row, std::uint8_t* scale_col);
void host_partial_amax(const Mxfp8Shape& shape, Range range, const float* master,
                       std::uint32_t* amax_row, std::uint32_t* amax_col);
void host_scales_from_amax(const Mxfp8Shape& shape, const std::uint32_t* amax_row,
                           const std::uint32_t* amax_col, std::uint8_t* scale_row,
                           std::uint8_t* scale_col);
void host_shard_data(const Mxfp8Shape& shape, Range range, const float* master,
                     const std::uint8_t* scale_row, const std::uint8_t* scale_col,
                     std::uint8_t* data_row, std::uint8_t* data_col);
void host_dequantize(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                     const std::uint8_t* scale, float* out);

}  // namespace shardopt::mxfp8
