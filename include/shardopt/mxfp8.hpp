// shardopt/mxfp8.hpp - MXFP8 parameters: the format, whole-tensor and sharded
// quantization, and dequantize helpers (to f32, or straight to bf16, one tensor or a list).
//
// Format. A weight of G members (G = 1 for a plain tensor) of [rows, cols] each is
// quantized from its bf16 values into two E4M3 planes with E8M0 block scales:
//   * rowwise: blocks of 1x32 consecutive elements of a row (the last block of a row
//     is partial when cols % 32 != 0);
//   * columnwise: blocks of 32x1, 32 consecutive rows of one column of one member
//     (partial when rows % 32 != 0). Blocks never straddle members, so a grouped
//     weight quantized as one tensor is byte for byte its members quantized one by
//     one and concatenated.
// Both data planes are stored in the tensor's own [G, rows, cols] order (numel bytes
// each). Scales are compact and unswizzled: rowwise [G*rows, ceil(cols/32)],
// columnwise [G*ceil(rows/32), cols] (swizzling is the GEMM's concern).
//
// Numerics. x = bf16 value (bf16(master) for the sharded path, round to
// nearest even). Block amax = max |x|, NaN anywhere makes it NaN. Scale byte: the
// smallest 2^e with 448 * 2^e >= amax, clamped to [2^-127, 2^127], stored as e + 127;
// all-zero block -> 0x00, NaN amax -> 0xFF, Inf amax -> 0xFE. The exponent comes
// exactly from the bf16 bits of amax = M * 2^E (M in [1, 2)): e = E - 8 if M <= 1.75,
// else E - 7 (bf16 subnormal amaxes clamp to 0x00). This equals TransformerEngine's
// RCEIL rule e8m0_ceil(fl32(amax * fl32(1/448))) for every positive bf16 value (checked
// exhaustively in test/unit/test_mxfp8.cpp): fl32(1/448) is 4/7 * 2^-8 (1 + d) with
// |d| < 2^-24, and a bf16 amax sits either exactly on 1.75 * 2^k, where the product
// rounds back to exactly 2^(k-8), or at least 2^-7.8 (relative) away from it.
// Elements: e4m3 = round-to-nearest-even, saturating to +-448, of fl32(x * 2^-e)
// (exact except where the product is below 2^-126, which rounds to zero in e4m3
// anyway). Special blocks, chosen here:
//   * NaN block (scale 0xFF): every element of the block is 0x7F (NaN) in that plane;
//   * Inf block (scale 0xFE, 2^127): Inf elements -> +-448 (0x7E / 0xFE), finite
//     elements -> e4m3(x * 2^-127) (zero unless |x| > 2^117);
//   * scale 0x00 decodes as 2^-127 and its elements are x * 2^127 (TransformerEngine's
//     kernels multiply by 1 for a 0x00 scale instead, so blocks whose amax is below
//     448 * 2^-127 differ from TE there: TE stores zeros, we store the scaled values).
//
// 1-D tensors (norm weights, biases) are not MXFP8: Mxfp8Shape::of rejects them.
//
// Sharded quantization (the gathered weight equals quantize(bf16(full master)) bitwise
// wherever shard boundaries fall, mid-block included). A rank owns
// the flat element range [begin, end) of the parameter (Layout segment: param_offset,
// length) and the fp32 master values of exactly that range. Blocks that a boundary
// cuts need the other rank's amax. Two exact schemes, same structure:
//   (A) scale exchange (recommended):
//         mxfp8_partial_scales   -> scale bytes of this rank's partial block amaxes,
//                                   0x00 for blocks it does not touch
//         all_reduce(scale_row and scale_col, DType::e8m0 as 8-bit unsigned, Max)
//         quantize_mxfp8_shard_data -> data bytes of [begin, end)
//       Exact because the scale byte is a monotone function of the amax (NaN > Inf >
//       finite map to 0xFF > 0xFE > <= 0xF7): the max of the partial scales is the
//       scale of the max of the partial amaxes, and elements depend on the amax only
//       through the scale byte. Exchange: 1 byte per block = numel/16 bytes per
//       parameter (0.0625 B/param; a ring all-reduce moves about twice that per rank,
//       ~6% of the 2 B/param data all-gather). No extra buffer: the scale tensors are
//       the exchange buffers, and every rank ends with the full scale tensors.
//   (B) amax exchange:
//         mxfp8_partial_amax     -> u32 amax bit patterns, 0 for untouched blocks
//         all_reduce(amax_row and amax_col, DType::u32, Max)
//         quantize_mxfp8_shard   -> all scale bytes + data bytes of [begin, end)
//       4 bytes per block = numel/4 bytes per parameter (0.25 B/param, a ring
//       all-reduce ~0.5 B/param per rank, +25% over the data all-gather) plus a
//       separate amax buffer. Use it if the communicator has no 8-bit Max.
// Boundary-only exchange (only the blocks a boundary cuts) would move even less, but
// then each rank knows only its own blocks' scales and the scale tensors, whose rank
// pieces are neither equal nor disjoint, would need their own irregular gather; the
// scale all-reduce is simpler and cheap. Every rank must make the phase-1 call (with
// an empty range if it owns none of the tensor) so its zeros join the reduction.
//
// Multi-tensor quantization. quantize_mxfp8_batch quantizes a whole list of weights
// (any shapes, grouped ones included, each with its own source and outputs) in ONE
// launch: an Mxfp8Batch, built once, holds the list as a device-resident table, and a
// persistent grid walks all the tensors' tiles as one sequence, so small matrices (the
// k/v projections of a model) cost neither a launch nor a partly filled wave each. The
// bytes are those of one quantize_mxfp8 call per tensor. Mxfp8ShardBatch does the same
// for the two phases of a rank's sharded quantization (scheme A) over many tensors:
// mxfp8_partial_scales_batch and quantize_mxfp8_shard_data_batch, one launch each.
//
// Every entry point is stream-ordered and capturable: no host reads of device data,
// no allocation; the host backend records the work on a capturing HostStream.
// (Building an Mxfp8Batch or Mxfp8ShardBatch allocates and copies: do it before
// capturing.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/param_spec.hpp"
#include "shardopt/range.hpp"

namespace shardopt {

/// Elements per MXFP8 block (rowwise 1x32, columnwise 32x1).
inline constexpr std::int64_t kMxfp8Block = 32;

/// The geometry of an MXFP8 weight: `members` matrices of [rows, cols], contiguous.
struct Mxfp8Shape {
  std::int64_t members = 1;  ///< G: MoE experts of a grouped weight, else 1
  std::int64_t rows = 0;     ///< rows of one member (all leading dims of a member folded)
  std::int64_t cols = 0;     ///< last dimension

  /// The shape of a registered parameter: a grouped spec gives G members of its member
  /// shape, a plain spec one member; leading dims fold into rows. Throws
  /// Error(InvalidArgument) for 1-D tensors (keep those bf16) and bad specs.
  static Mxfp8Shape of(const ParamSpec& spec);
  /// The shape of a tensor of `shape` holding `members` equal members along dim 0
  /// (members == 1: a plain tensor). Same rules as of(ParamSpec).
  static Mxfp8Shape of(const Shape& shape, std::int64_t members = 1);

  /// Elements of one member and of the whole tensor (= bytes of one data plane).
  std::int64_t member_numel() const noexcept { return rows * cols; }
  std::int64_t numel() const noexcept { return members * rows * cols; }
  /// Rowwise blocks per row: ceil(cols / 32).
  std::int64_t row_blocks() const noexcept { return (cols + kMxfp8Block - 1) / kMxfp8Block; }
  /// Columnwise blocks per column of one member: ceil(rows / 32).
  std::int64_t col_blocks() const noexcept { return (rows + kMxfp8Block - 1) / kMxfp8Block; }
  /// Entries (bytes) of the rowwise scale tensor [members*rows, row_blocks()].
  std::int64_t scale_row_numel() const noexcept { return members * rows * row_blocks(); }
  /// Entries (bytes) of the columnwise scale tensor [members*col_blocks(), cols].
  std::int64_t scale_col_numel() const noexcept { return members * col_blocks() * cols; }

  /// Flat index of element (g, r, c) in the source and in both data planes.
  std::int64_t element_index(std::int64_t g, std::int64_t r, std::int64_t c) const noexcept {
    return (g * rows + r) * cols + c;
  }
  /// Index in the rowwise scale tensor of the block holding element (g, r, c).
  std::int64_t scale_row_index(std::int64_t g, std::int64_t r, std::int64_t c) const noexcept {
    return (g * rows + r) * row_blocks() + c / kMxfp8Block;
  }
  /// Index in the columnwise scale tensor of the block holding element (g, r, c).
  std::int64_t scale_col_index(std::int64_t g, std::int64_t r, std::int64_t c) const noexcept {
    return (g * col_blocks() + r / kMxfp8Block) * cols + c;
  }
};

/// Throws Error(InvalidArgument) unless members, rows and cols are all positive.
void validate(const Mxfp8Shape& shape);

/// The four outputs of a quantization (device memory of the backend).
struct Mxfp8Planes {
  std::uint8_t* data_row = nullptr;   ///< e4m3, [G, rows, cols]
  std::uint8_t* scale_row = nullptr;  ///< e8m0, [G*rows, ceil(cols/32)]
  std::uint8_t* data_col = nullptr;   ///< e4m3, [G, rows, cols]
  std::uint8_t* scale_col = nullptr;  ///< e8m0, [G*ceil(rows/32), cols]
};

/// Which plane a dequantize reads.
enum class Mxfp8Plane { Rowwise, Columnwise };

/// Where one member of a grouped weight lives, relative to the base pointers given to
/// quantize_mxfp8: its source elements and both its data planes start at
/// element_offset, its scales at the two scale offsets. A device-resident array of
/// these (built once, e.g. from mxfp8_contiguous_members or from the Layout placements
/// of G discretely registered members) lets one launch quantize every member, and a
/// grouped GEMM find them, without host-side split sizes per step.
struct Mxfp8Member {
  std::int64_t element_offset = 0;    ///< into the source and both data planes
  std::int64_t scale_row_offset = 0;  ///< into the rowwise scales
  std::int64_t scale_col_offset = 0;  ///< into the columnwise scales
};

/// The member table of a contiguous [G, rows, cols] tensor: member g at g*rows*cols,
/// rowwise scales at g*rows*row_blocks(), columnwise at g*col_blocks()*cols.
std::vector<Mxfp8Member> mxfp8_contiguous_members(const Mxfp8Shape& shape);

/// Whole-tensor quantization of bf16 `src` (bit patterns) into both planes.
/// `skip_flag` (device int32, may be null) is read by the kernel when it runs: when
/// nonzero nothing is written, so one captured graph serves every microbatch of a
/// trainer that quantizes its weights only on the first (a host flag read at capture time
/// would be frozen into the graph).
/// `members` (device array of shape.members entries, may be null): member g is read
/// from src + members[g].element_offset and written at the offsets of members[g]
/// relative to the pointers in `out`; null means contiguous. One launch either way;
/// the table is read on the device only (never on the host).
void quantize_mxfp8(const Mxfp8Shape& shape, const std::uint16_t* src, const Mxfp8Planes& out,
                    const std::int32_t* skip_flag, Backend backend, Stream stream,
                    const Mxfp8Member* members = nullptr);

/// One tensor of a multi-tensor quantization: the arguments of one quantize_mxfp8 call
/// (device memory of the batch's backend).
struct Mxfp8Tensor {
  Mxfp8Shape shape;
  const std::uint16_t* src = nullptr;    ///< bf16 bit patterns
  Mxfp8Planes out;                       ///< the four outputs
  const Mxfp8Member* members = nullptr;  ///< device member table (shape.members entries), or null
};

/// A list of tensors to quantize together, as a device-resident table (owned: RAII).
/// Built once (it validates, allocates and uploads the table, then waits for the copy;
/// not while a stream of the device is being captured); quantize_mxfp8_batch then reads
/// only device memory, so any number of captured or eager calls may follow. The
/// pointers given are used as they are at every call (their memory must outlive the
/// batch's use), and the batch must outlive every graph that captured a call (the graph
/// reads its table). Outputs of different tensors must not overlap. On CUDA the batch
/// belongs to the device that is current when it is built.
class Mxfp8Batch {
 public:
  /// Throws Error(InvalidArgument) for an empty list and, naming the tensor's index,
  /// for a bad shape or a null source or output pointer (as quantize_mxfp8 would).
  Mxfp8Batch(const std::vector<Mxfp8Tensor>& tensors, Backend backend);
  ~Mxfp8Batch();
  Mxfp8Batch(Mxfp8Batch&&) noexcept;
  Mxfp8Batch& operator=(Mxfp8Batch&&) noexcept;
  Mxfp8Batch(const Mxfp8Batch&) = delete;
  Mxfp8Batch& operator=(const Mxfp8Batch&) = delete;

  /// The backend whose memory holds the table.
  Backend backend() const;
  /// Number of tensors.
  std::size_t size() const;
  /// Elements of all tensors together (bytes read: 2 per element).
  std::int64_t numel() const;
  /// Tiles of 32 x 128 elements of all tensors (the kernel's units of work).
  std::int64_t tiles() const;
  /// Blocks of the CUDA launch (a persistent grid of at most one wave of resident
  /// blocks, fixed when the batch is built); 0 on the host.
  int grid() const;

 private:
  friend void quantize_mxfp8_batch(const Mxfp8Batch&, const std::int32_t*, Backend, Stream);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Quantizes every tensor of `batch`, bitwise as quantize_mxfp8 per tensor would, in
/// one launch. `skip_flag` (device int32, may be null) is read by the kernel when it
/// runs: when nonzero nothing is written (read on the device, so a captured graph honours
/// it), as in quantize_mxfp8. Throws
/// Error(InvalidArgument) when `backend` is not the batch's backend (or, on CUDA, the
/// current device is not the batch's).
void quantize_mxfp8_batch(const Mxfp8Batch& batch, const std::int32_t* skip_flag, Backend backend,
                          Stream stream);

// The per-tensor sharded calls (scheme A's two phases, scheme B) are internal
// (src/kernels/mxfp8/mxfp8_shard_calls.hpp): the optimizer and every trainer use the batches
// below, which do the same in one launch per phase.

/// One tensor of a multi-tensor sharded quantization (scheme A): the arguments of one
/// mxfp8_partial_scales + quantize_mxfp8_shard_data pair (device memory of the batch's
/// backend). The tensor's members are contiguous. `out.data_row` and `out.data_col`
/// receive element i at [i] for i in `range` only, so they may point before the memory
/// they write (a staging slice of the rank's range: pass its address minus
/// range.begin); the scale tensors are whole.
struct Mxfp8ShardTensor {
  Mxfp8Shape shape;
  Range range;                   ///< this rank's flat element range [begin, end) (may be empty)
  const float* master = nullptr;  ///< element i at master[i - range.begin]; null if range is empty
  Mxfp8Planes out;               ///< full scale tensors (exchanged), data written in range only
};

/// The tensors of one rank's sharded quantization as a device-resident table (owned:
/// RAII), for phase 1 and phase 2 of scheme (A) over all of them in ONE launch each: a
/// persistent grid walks the tiles of every tensor's range as one sequence, so neither
/// a small tensor nor a rank's small piece of a large one costs a launch or a partly
/// filled wave. Built once (it validates, allocates, uploads and waits; not while a
/// stream of the device is being captured); then any number of captured or eager calls.
/// Pointers are used as given at every call; the batch must outlive the graphs that
/// captured a call. On CUDA it belongs to the device current when it is built.
class Mxfp8ShardBatch {
 public:
  /// Throws, naming the tensor's index, Error(OutOfRange) for a range outside the tensor
  /// (as the per-tensor calls do) and Error(InvalidArgument) for an empty list, a bad
  /// shape, a null scale pointer (or a null master or data pointer for a non-empty
  /// range), and for outputs that overlap (scale tensors, or the data bytes of the
  /// ranges; of two tensors or of one).
  Mxfp8ShardBatch(const std::vector<Mxfp8ShardTensor>& tensors, Backend backend);
  ~Mxfp8ShardBatch();
  Mxfp8ShardBatch(Mxfp8ShardBatch&&) noexcept;
  Mxfp8ShardBatch& operator=(Mxfp8ShardBatch&&) noexcept;
  Mxfp8ShardBatch(const Mxfp8ShardBatch&) = delete;
  Mxfp8ShardBatch& operator=(const Mxfp8ShardBatch&) = delete;

  /// The backend whose memory holds the table.
  Backend backend() const;
  /// Number of tensors.
  std::size_t size() const;
  /// Elements of all ranges together (master values read by each phase).
  std::int64_t numel() const;
  /// The kernels' units of work: the tiles of 32 x 128 elements (of one member) of every
  /// tile row that holds an element of a range, all column tiles of such a row.
  std::int64_t tiles() const;
  /// Blocks of each CUDA launch (at most one wave of resident blocks); 0 on the host.
  int grid() const;
  /// Contiguous runs of scale memory that phase 1 zero-fills (adjacent scale tensors
  /// merge: 1 when every tensor's scales lie back to back, in any order).
  std::size_t scale_spans() const;
  /// Tiles the rest pass (quantize_mxfp8_shard_rest_batch) works on: those of the tile
  /// rows that hold an element of a range but are not wholly inside it (at most two per
  /// tensor; 0 when every range is a whole tensor, as with one rank).
  std::int64_t rest_tiles() const;

 private:
  friend void mxfp8_partial_scales_batch(const Mxfp8ShardBatch&, Backend, Stream);
  friend void quantize_mxfp8_shard_data_batch(const Mxfp8ShardBatch&, Backend, Stream);
  friend void quantize_mxfp8_shard_owned_batch(const Mxfp8ShardBatch&, Backend, Stream);
  friend void quantize_mxfp8_shard_rest_batch(const Mxfp8ShardBatch&, Backend, Stream);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// mxfp8_partial_scales of every tensor of `batch`, bitwise: zero-fills every scale
/// tensor (one memset per scale span), then writes the partial scales of all tensors in
/// one launch. Next, all-reduce the scale tensors with Max (they are the exchange
/// buffers; lay them out back to back to reduce them in one call). Throws
/// Error(InvalidArgument) when `backend` is not the batch's backend (or, on CUDA, the
/// current device is not the batch's).
void mxfp8_partial_scales_batch(const Mxfp8ShardBatch& batch, Backend backend, Stream stream);

/// quantize_mxfp8_shard_data of every tensor of `batch`, bitwise, in one launch: the
/// data bytes of each range from the combined scales. Same errors as
/// mxfp8_partial_scales_batch.
void quantize_mxfp8_shard_data_batch(const Mxfp8ShardBatch& batch, Backend backend, Stream stream);

// The same two phases split so that the master is read once where it can be: a block
// that lies wholly inside this rank's range needs nobody else's amax, so its scale is
// final before the exchange and its data can be written in the pass that reads it.
// quantize_mxfp8_shard_owned_batch, the all-reduce, then quantize_mxfp8_shard_rest_batch
// leave every byte (scales after the all-reduce, data of the ranges) as
// mxfp8_partial_scales_batch, the all-reduce and quantize_mxfp8_shard_data_batch do.

/// Phase 1 with the data of the whole tile rows: writes exactly the scale bytes
/// mxfp8_partial_scales_batch writes (zero-fill, then the partial scales of every block
/// the ranges touch), and in the same launch the data bytes of the elements of every
/// tile row (32 rows of a member, all its columns) that lies wholly inside its range.
/// Next, all-reduce the scales with Max, then quantize_mxfp8_shard_rest_batch. Same
/// errors as mxfp8_partial_scales_batch.
void quantize_mxfp8_shard_owned_batch(const Mxfp8ShardBatch& batch, Backend backend, Stream stream);

/// Phase 2 of what the owned pass left: the data bytes of the range elements in tile
/// rows that are not wholly inside their range (rest_tiles(); no launch when 0), from
/// the combined scales. Same errors as mxfp8_partial_scales_batch.
void quantize_mxfp8_shard_rest_batch(const Mxfp8ShardBatch& batch, Backend backend, Stream stream);

/// Decodes one plane to f32 (contiguous members): out[i] = fl32(e4m3(data[i]) *
/// 2^(scale - 127)) with scale 0x00 -> 2^-127 and 0xFF -> NaN (correctly rounded; exact
/// unless the result is an f32 subnormal).
void dequantize_mxfp8(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                      const std::uint8_t* scale, float* out, Backend backend, Stream stream);

/// Decodes one plane straight to bf16 (bit patterns, contiguous members), for GEMMs that
/// read bf16: out[i] = bf16 (round to nearest even) of the f32 decode above, bitwise,
/// in one pass; a NaN element or block gives the one NaN 0x7FC0 on both backends.
void dequantize_mxfp8(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                      const std::uint8_t* scale, std::uint16_t* out, Backend backend, Stream stream);

/// One tensor of a batched bf16 decode: the arguments of one bf16 dequantize_mxfp8 call
/// (device memory of the backend).
struct Mxfp8Decode {
  Mxfp8Shape shape;                        ///< contiguous members
  Mxfp8Plane plane = Mxfp8Plane::Rowwise;  ///< the plane to decode
  const std::uint8_t* data = nullptr;      ///< that plane's e4m3 bytes
  const std::uint8_t* scale = nullptr;     ///< that plane's e8m0 scales
  std::uint16_t* out = nullptr;            ///< numel() bf16 bit patterns
};

/// Tensors one launch of dequantize_mxfp8_batch decodes: the list travels in the
/// launch's own parameters, so a longer list takes one launch per this many.
inline constexpr std::size_t kMxfp8DecodeLaunch = 32;

/// Decodes every tensor of `tensors` straight to bf16, bitwise as one bf16
/// dequantize_mxfp8 call per tensor, in one launch per kMxfp8DecodeLaunch tensors (e.g.
/// the weights of one FSDP unit together). Nothing to build first and nothing allocated
/// on the device: call it eagerly or while capturing. Outputs must not overlap. Throws
/// Error(InvalidArgument) for an empty list and, naming the tensor's index, for a bad
/// shape or a null pointer.
void dequantize_mxfp8_batch(const std::vector<Mxfp8Decode>& tensors, Backend backend, Stream stream);

}  // namespace shardopt
