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

/// One tensor of a rank's sharded quantization as the kernels and the host twins read
/// it: the arguments of one nvfp4_partial_amax + quantize_nvfp4_shard pair and where its
/// units sit in the batch's sequences. Nvfp4ShardBatch uploads a table of these; the
/// per-tensor calls pass one by value.
struct ShardEntry {
  Nvfp4Shape shape;
  Range range;                      ///< the rank's flat elements
  const float* master = nullptr;    ///< element i at master[i - range.begin]
  std::uint32_t* amax = nullptr;    ///< amax_numel() u32 entries (phase 1 writes, phase 2 reads)
  Nvfp4Planes out;                  ///< out.data: the bytes of nvfp4_shard_bytes(range), from its first
  Range touched;                    ///< touched_blocks(shape, range): the blocks phase 1 writes
  std::int64_t first_amax = 0;      ///< index of the tensor's first amax entry in the batch
  std::int64_t first_touched = 0;   ///< index of its first touched block in the batch
  std::int64_t first_block = 0;     ///< index of its first block in the batch
  std::int64_t first_byte = 0;      ///< index of its first shard byte in the batch
};

/// Counts of the units of shard entries: amax entries (phase 1 zeroes them), touched
/// blocks (phase 1), blocks (phase 2 scales) and shard bytes (phase 2 data).
struct ShardUnits {
  std::int64_t amax = 0, touched = 0, blocks = 0, bytes = 0;
};

/// The entry of one (checked) tensor whose units start at `first`.
ShardEntry make_shard_entry(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax,
                            const Nvfp4Planes& out, const ShardUnits& first);
/// Where the units of the entry after `e` start (for the last entry: the counts of all).
ShardUnits units_after(const ShardEntry& e);

// ------------------------------------------------------------------ CUDA (nvfp4.cu)

/// Whole-tensor quantize of the `count` entries of the device table `entries`, or of
/// `one` when `entries` is null; `blocks` and `bytes`: the units of all of them. Every
/// kernel returns at once when `skip_flag` (device int32, may be null) is nonzero.
void launch_quantize(const QuantizeEntry* entries, int count, const QuantizeEntry& one, std::int64_t blocks,
                     std::int64_t bytes, const std::int32_t* skip_flag, Stream stream);
/// The data plane to f32 or to bf16 (out_f32 or out_bf16, the other null); returns at
/// once when `skip_flag` (device int32, may be null) is nonzero.
void launch_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                       const float* decode_scale, float* out_f32, std::uint16_t* out_bf16,
                       const std::int32_t* skip_flag, Stream stream);

// ------------------------------------------------------------------ CUDA (nvfp4_shard.cu)
// Over the `count` entries of the device table `entries`, or `one` when it is null;
// `units`: those of all of them. Two launches each.

/// Phase 1: zero every amax buffer, then the partial amaxes of every range.
void launch_partial_amax(const ShardEntry* entries, int count, const ShardEntry& one, const ShardUnits& units,
                         Stream stream);
/// Phase 2: every scale and the two fp32 values, then the data bytes of every range.
void launch_quantize_shard(const ShardEntry* entries, int count, const ShardEntry& one, const ShardUnits& units,
                           Stream stream);

// ------------------------------------------------------------------ host twins (nvfp4_host.cpp)
// Same results, byte for byte; they run synchronously (the dispatchers enqueue them).

/// host quantize of each of the `count` entries, in order.
void host_quantize(const QuantizeEntry* entries, int count);
/// Phase 1, then phase 2, of each of the `count` entries, in order.
void host_partial_amax(const ShardEntry* entries, int count);
void host_quantize_shard(const ShardEntry* entries, int count);
void host_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                     const float* decode_scale, float* out_f32, std::uint16_t* out_bf16);

}  // namespace shardopt::nvfp4
