// shardopt/nvfp4.hpp - NVFP4 weights: the format, whole-tensor and sharded
// quantization, and dequantize. The rules, the byte layout and the reasons are in
// docs/nvfp4.md; this header says what each call does.
//
// Format (TransformerEngine's NVFP4 weight recipe). A 2-D weight [rows, cols] of bf16
// values becomes:
//   * data: E2M1 codes, two per byte (element 2i in the low nibble of byte i, element
//     2i + 1 in the high nibble, row-major over the whole tensor): ceil(numel / 2) bytes;
//   * scale: one E4M3 decode scale per 16 x 16 block, compact row-major over the block
//     grid [ceil(rows / 16), ceil(cols / 16)], unswizzled (edge blocks are partial);
//   * amax and decode_scale: two fp32 values per tensor, the tensor's amax (its
//     magnitude: +0 for an all-zero tensor, -0 elements included) and S_dec = 1 / S_enc
//     with S_enc = min(2688 / amax, FLT_MAX) (448 * 6; the clamp catches amaxes below
//     about 7.9e-36, where S_dec = 2^-128 is an fp32 subnormal, kept as it is), and
//     S_enc = 1 when amax is 0.
// The columnwise (transposed) form uses the transposed tensor's own 16 x 16 blocks: the
// same blocks, so the same scale bytes (the scale grid read transposed). Only the
// rowwise data plane is produced here.
//
// Non-finite input (NaN or +-Inf anywhere in the tensor; in the sharded path also a
// finite master that rounds to bf16 Inf) is refused through a flag on
// the device: the stored amax and decode_scale are NaN, every scale byte is 0x7F (E4M3
// NaN) and every data byte 0, so that dequantize gives NaN everywhere. Check the amax
// (std::isnan) where the tensor may hold non-finite values.
//
// Sharded quantization (the assembled bytes equal quantize_nvfp4 of bf16(full master)
// bitwise wherever the shard boundaries fall, mid-block and mid-byte included). A rank
// owns the flat elements [begin, end) and their fp32 master values:
//   1. nvfp4_partial_amax      -> u32 amaxes of the blocks it touches and of its range
//   2. all_reduce(amax, DType::u32, Max) over the ranks
//   3. quantize_nvfp4_shard    -> every scale, amax, decode_scale, and the data bytes of
//                                 nvfp4_shard_bytes(range) (from out.data[0] on), nibbles
//                                 of other ranks' elements 0
//   4. gather the data bytes; where two ranks' byte spans share a byte (an odd
//      boundary) the byte is the bitwise OR of the two ranks' bytes.
// Every rank must make the phase-1 call (an empty range if it owns nothing of the
// tensor) so its zeros join the reduction. Nvfp4ShardBatch runs phases 1 and 3 for many
// tensors in a fixed number of launches (nvfp4_partial_amax_batch,
// quantize_nvfp4_shard_batch).
//
// Decode: dequantize_nvfp4 decodes one tensor to f32 or bf16; dequantize_nvfp4_batch
// decodes a list of tensors to bf16 in one launch (per 64 tensors), bitwise the same.
//
// Every entry point is stream-ordered and capturable: no host reads of device data, no
// allocation (building an Nvfp4Batch or Nvfp4ShardBatch allocates: do it before
// capturing); the host backend records the work on a capturing HostStream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/param_spec.hpp"
#include "shardopt/range.hpp"

namespace shardopt {

/// Rows and columns of an NVFP4 block (blocks are 16 x 16 elements).
inline constexpr std::int64_t kNvfp4Block = 16;

/// The geometry of an NVFP4 weight: a row-major [rows, cols] matrix.
struct Nvfp4Shape {
  std::int64_t rows = 0;  ///< all leading dimensions folded
  std::int64_t cols = 0;  ///< the last dimension

  /// The shape of a tensor of at least 2 dimensions (leading dims fold into rows).
  /// Throws Error(InvalidArgument) for fewer dimensions (keep 1-D tensors in bf16).
  static Nvfp4Shape of(const Shape& shape);

  /// Elements of the tensor.
  constexpr std::int64_t numel() const noexcept { return rows * cols; }
  /// Bytes of the data plane: two elements per byte, ceil(numel / 2).
  constexpr std::int64_t data_bytes() const noexcept { return (numel() + 1) / 2; }
  /// Blocks down the rows, ceil(rows / 16), and across the columns, ceil(cols / 16).
  constexpr std::int64_t block_rows() const noexcept { return (rows + kNvfp4Block - 1) / kNvfp4Block; }
  constexpr std::int64_t block_cols() const noexcept { return (cols + kNvfp4Block - 1) / kNvfp4Block; }
  /// Bytes of the scale plane: one per block.
  constexpr std::int64_t scale_numel() const noexcept { return block_rows() * block_cols(); }
  /// Entries of the u32 buffer the sharded path exchanges: one per block, then one for
  /// the tensor's amax (at index scale_numel()).
  constexpr std::int64_t amax_numel() const noexcept { return scale_numel() + 1; }
  /// Index in the scale plane of the block holding element (r, c).
  constexpr std::int64_t block_index(std::int64_t r, std::int64_t c) const noexcept {
    return (r / kNvfp4Block) * block_cols() + c / kNvfp4Block;
  }
};

/// Throws Error(InvalidArgument) unless rows and cols are positive (and not too large).
void validate(const Nvfp4Shape& shape);

/// The outputs of a quantization (memory of the backend).
struct Nvfp4Planes {
  std::uint8_t* data = nullptr;    ///< E2M1 pairs, data_bytes() bytes
  std::uint8_t* scale = nullptr;   ///< E4M3 block decode scales, scale_numel() bytes
  float* amax = nullptr;           ///< one fp32: the tensor's amax (NaN: refused, see above)
  float* decode_scale = nullptr;   ///< one fp32: S_dec = 1 / S_enc
};

/// The bytes of the data plane that hold an element of `range`: [begin / 2, ceil(end / 2)).
Range nvfp4_shard_bytes(Range range);

/// Whole-tensor quantization of bf16 `src` (bit patterns, numel values) into `out`.
/// `skip_flag` (device int32, may be null) is read when the work runs: nonzero writes
/// nothing, so one captured graph serves steps that must not quantize (a host flag read
/// at capture time would be frozen into the graph). Throws Error(InvalidArgument) for a
/// bad shape or a null pointer.
void quantize_nvfp4(const Nvfp4Shape& shape, const std::uint16_t* src, const Nvfp4Planes& out,
                    const std::int32_t* skip_flag, Backend backend, Stream stream);

/// One tensor of a multi-tensor quantization: the arguments of one quantize_nvfp4 call.
struct Nvfp4Tensor {
  Nvfp4Shape shape;
  const std::uint16_t* src = nullptr;  ///< bf16 bit patterns
  Nvfp4Planes out;
};

/// A list of tensors to quantize together, as a table in the backend's memory (owned:
/// RAII). Built once (it validates, allocates, uploads and waits; not while capturing);
/// then quantize_nvfp4_batch reads only that table, eagerly or in captured graphs. The
/// pointers are used as given at every call; the batch must outlive the graphs that
/// captured a call. On CUDA it belongs to the device current when it is built.
class Nvfp4Batch {
 public:
  /// Throws Error(InvalidArgument) for an empty list and, naming the tensor's index, for
  /// a bad shape or a null pointer (as quantize_nvfp4 would).
  Nvfp4Batch(const std::vector<Nvfp4Tensor>& tensors, Backend backend);
  ~Nvfp4Batch();
  Nvfp4Batch(Nvfp4Batch&&) noexcept;
  Nvfp4Batch& operator=(Nvfp4Batch&&) noexcept;
  Nvfp4Batch(const Nvfp4Batch&) = delete;
  Nvfp4Batch& operator=(const Nvfp4Batch&) = delete;

  /// The backend whose memory holds the table.
  Backend backend() const;
  /// Number of tensors.
  std::size_t size() const;
  /// Elements of all tensors together.
  std::int64_t numel() const;

 private:
  friend void quantize_nvfp4_batch(const Nvfp4Batch&, const std::int32_t*, Backend, Stream);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Quantizes every tensor of `batch`, bitwise as one quantize_nvfp4 call per tensor, in
/// a fixed number of launches whatever the number of tensors. `skip_flag` (device int32,
/// may be null): read when the work runs, nonzero writes nothing, as in quantize_nvfp4.
/// Throws Error(InvalidArgument) when `backend` is not the batch's (or, on CUDA, the
/// current device is not the batch's).
void quantize_nvfp4_batch(const Nvfp4Batch& batch, const std::int32_t* skip_flag, Backend backend,
                          Stream stream);

/// Sharded phase 1: writes `amax` (amax_numel() u32 entries) with, for every block that
/// `range` touches, the f32 bit pattern of the amax of bf16(master) over the block's
/// elements inside the range, and at [scale_numel()] the amax over the whole range; 0
/// elsewhere. A NaN or Inf element counts as 0x7FC00000 (above every finite amax), so
/// an unsigned Max over the ranks' buffers is the amax of the union. Element i (flat
/// index in [range.begin, range.end)) is master[i - range.begin]. Throws
/// Error(OutOfRange) for a range outside the tensor, Error(InvalidArgument) for a bad
/// shape or a null pointer (master may be null for an empty range).
void nvfp4_partial_amax(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax,
                        Backend backend, Stream stream);

/// Sharded phase 2: from the combined `amax` buffer, writes every scale byte, the amax
/// and decode_scale of `out`, and the data bytes of nvfp4_shard_bytes(range): byte k of
/// the data plane at out.data[k - range.begin / 2], so out.data is the first byte of the
/// span's memory (e.g. a staging slice; it may be null for an empty range). Nibbles of
/// elements outside the range are 0. Same errors as nvfp4_partial_amax.
void quantize_nvfp4_shard(const Nvfp4Shape& shape, Range range, const float* master, const std::uint32_t* amax,
                          const Nvfp4Planes& out, Backend backend, Stream stream);

/// One tensor of a rank's sharded quantization: the arguments of one nvfp4_partial_amax +
/// quantize_nvfp4_shard pair (memory of the batch's backend).
struct Nvfp4ShardTensor {
  Nvfp4Shape shape;
  Range range;                     ///< this rank's flat elements [begin, end) (may be empty)
  const float* master = nullptr;   ///< element i at master[i - range.begin]; null if range is empty
  std::uint32_t* amax = nullptr;   ///< amax_numel() u32 entries: phase 1 writes, phase 2 reads
  Nvfp4Planes out;                 ///< whole scale plane; data: the span's bytes (null if range is empty)
};

/// The tensors of one rank's sharded quantization as a table in the backend's memory
/// (owned: RAII), for both phases over all of them in a fixed number of launches. Built
/// once (it validates, allocates, uploads and waits; not while capturing); then any
/// number of captured or eager calls. Pointers are used as given at every call; the
/// batch must outlive the graphs that captured a call. On CUDA it belongs to the device
/// current when it is built.
class Nvfp4ShardBatch {
 public:
  /// Throws, naming the tensor's index, what the per-tensor calls throw: Error(OutOfRange)
  /// for a range outside the tensor, Error(InvalidArgument) for a bad shape or a null
  /// pointer; and Error(InvalidArgument) for an empty list and for memory written that
  /// overlaps (amax buffers, scales, the fp32 values, the data of the ranges; of two
  /// tensors or of one).
  Nvfp4ShardBatch(const std::vector<Nvfp4ShardTensor>& tensors, Backend backend);
  ~Nvfp4ShardBatch();
  Nvfp4ShardBatch(Nvfp4ShardBatch&&) noexcept;
  Nvfp4ShardBatch& operator=(Nvfp4ShardBatch&&) noexcept;
  Nvfp4ShardBatch(const Nvfp4ShardBatch&) = delete;
  Nvfp4ShardBatch& operator=(const Nvfp4ShardBatch&) = delete;

  /// The backend whose memory holds the table.
  Backend backend() const;
  /// Number of tensors.
  std::size_t size() const;
  /// Elements of all ranges together (master values read by each phase).
  std::int64_t numel() const;

 private:
  friend void nvfp4_partial_amax_batch(const Nvfp4ShardBatch&, Backend, Stream);
  friend void quantize_nvfp4_shard_batch(const Nvfp4ShardBatch&, Backend, Stream);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// nvfp4_partial_amax of every tensor of `batch`, bitwise, in at most three launches (zero
/// every amax buffer, then the partial amaxes). Next, all-reduce the amax buffers with u32 Max
/// (lay them out back to back to reduce them in one call). Throws Error(InvalidArgument)
/// when `backend` is not the batch's (or, on CUDA, the current device is not the batch's).
void nvfp4_partial_amax_batch(const Nvfp4ShardBatch& batch, Backend backend, Stream stream);

/// quantize_nvfp4_shard of every tensor of `batch`, bitwise, in at most three launches
/// (scales, then data bytes). Same errors as nvfp4_partial_amax_batch.
void quantize_nvfp4_shard_batch(const Nvfp4ShardBatch& batch, Backend backend, Stream stream);

/// Decodes the data plane to f32: out[i] = fl32(e2m1 * fl32(e4m3(scale of i's block) *
/// decode_scale)); NaN everywhere for a refused tensor.
void dequantize_nvfp4(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                      const float* decode_scale, float* out, Backend backend, Stream stream);

/// As above, then rounded to bf16 (nearest even) into `out` (bit patterns).
void dequantize_nvfp4(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                      const float* decode_scale, std::uint16_t* out, Backend backend, Stream stream);

/// The bf16 decode with a device skip flag (int32, may be null), read when the work runs:
/// nonzero writes nothing, as in quantize_nvfp4 (a trainer decoding its weights once per
/// step from a graph replayed for every microbatch).
void dequantize_nvfp4(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                      const float* decode_scale, std::uint16_t* out, const std::int32_t* skip_flag, Backend backend,
                      Stream stream);

/// One tensor of a batched bf16 decode: the arguments of one bf16 dequantize_nvfp4 call
/// (memory of the backend).
struct Nvfp4Decode {
  Nvfp4Shape shape;
  const std::uint8_t* data = nullptr;   ///< data_bytes() bytes of E2M1 pairs
  const std::uint8_t* scale = nullptr;  ///< scale_numel() E4M3 block scales
  const float* decode_scale = nullptr;  ///< the tensor's S_dec (one fp32)
  std::uint16_t* out = nullptr;         ///< numel() bf16 bit patterns
};

/// Tensors one launch of dequantize_nvfp4_batch decodes: the list travels in the
/// launch's own parameters, so a longer list takes one launch per this many.
inline constexpr std::size_t kNvfp4DecodeLaunch = 64;

/// Decodes every tensor of `tensors` to bf16, bitwise as one bf16 dequantize_nvfp4 call
/// per tensor, in one launch per kNvfp4DecodeLaunch tensors (all members of a grouped
/// weight, or a whole list of experts, in one launch). Nothing to build first and nothing
/// allocated on the device: call it eagerly or while capturing. `skip_flag` (device
/// int32, may be null) is read when the work runs: nonzero writes nothing, as in
/// dequantize_nvfp4. Outputs must not overlap. Throws Error(InvalidArgument) for an
/// empty list and, naming the tensor's index, for a bad shape or a null pointer.
void dequantize_nvfp4_batch(const std::vector<Nvfp4Decode>& tensors, const std::int32_t* skip_flag, Backend backend,
                            Stream stream);

}  // namespace shardopt
