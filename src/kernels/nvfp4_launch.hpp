// nvfp4_launch.hpp - internal: the CUDA launch wrappers (nvfp4*.cu) and the host twins
// (nvfp4_host.cpp) behind the entry points of shardopt/nvfp4.hpp. Arguments are
// validated by the dispatchers (nvfp4*.cpp) before they get here.
#pragma once

#include <cstdint>

#include "shardopt/backend.hpp"
#include "shardopt/nvfp4.hpp"
#include "shardopt/range.hpp"

namespace shardopt::nvfp4 {

/// One tensor of a whole-tensor quantization as the kernels and the host twin read it:
/// the arguments of a quantize_nvfp4 call and where its units sit in the batch's
/// sequences of blocks and of data bytes. Nvfp4Batch uploads a table of these;
/// quantize_nvfp4 passes one by value.
struct QuantizeEntry {
  Nvfp4Shape shape;
  const std::uint16_t* src = nullptr;
  Nvfp4Planes out;
  std::int64_t first_block = 0;  ///< index of the tensor's first block in the batch
  std::int64_t first_byte = 0;   ///< index of the tensor's first data byte in the batch
};

/// The entry of one tensor whose units start at `first_block` and `first_byte`.
QuantizeEntry make_quantize_entry(const Nvfp4Shape& shape, const std::uint16_t* src, const Nvfp4Planes& out,
                                  std::int64_t first_block, std::int64_t first_byte);

// ------------------------------------------------------------------ CUDA (nvfp4.cu)

/// Whole-tensor quantize of the `count` entries of the device table `entries`, or of
/// `one` when `entries` is null; `blocks` and `bytes`: the units of all of them.
void launch_quantize(const QuantizeEntry* entries, int count, const QuantizeEntry& one, std::int64_t blocks,
                     std::int64_t bytes, Stream stream);
/// The data plane to f32 or to bf16 (out_f32 or out_bf16, the other null).
void launch_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                       const float* decode_scale, float* out_f32, std::uint16_t* out_bf16, Stream stream);

// ------------------------------------------------------------------ CUDA (nvfp4_shard.cu)

/// Phase 1: partial amaxes of `range` (the caller zeroed the amax buffer).
void launch_partial_amax(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax,
                         Stream stream);
/// Phase 2: every scale, the two fp32 values, and the data bytes of `range`.
void launch_quantize_shard(const Nvfp4Shape& shape, Range range, const float* master, const std::uint32_t* amax,
                           const Nvfp4Planes& out, Stream stream);

// ------------------------------------------------------------------ host twins (nvfp4_host.cpp)
// Same results, byte for byte; they run synchronously (the dispatchers enqueue them).

/// host quantize of each of the `count` entries, in order.
void host_quantize(const QuantizeEntry* entries, int count);
void host_partial_amax(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax);
void host_quantize_shard(const Nvfp4Shape& shape, Range range, const float* master, const std::uint32_t* amax,
                         const Nvfp4Planes& out);
void host_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                     const float* decode_scale, float* out_f32, std::uint16_t* out_bf16);

}  // namespace shardopt::nvfp4
