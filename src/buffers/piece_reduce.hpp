// piece_reduce.hpp - GradReducePrecision::F32Accumulate's reduce-scatter of one bucket,
// pipelined in chunks (docs/grad_reduce.md): each rank's piece is cut into K chunks; the
// all-to-all of chunk k runs on the caller's stream while the rank-ordered fp32 sum of
// chunk k - 1 runs on a sum stream, so only the last chunk's sum follows the
// communication. Per element nothing changes (the same pieces, the same order, the same
// rounding): the bits do not depend on K.
//
// CUDA: chunk k's all-to-all records moved[k] on the caller's stream, the sum stream
// waits for it and sums chunk k; after the last chunk the caller's stream waits for the
// sum stream (a fork and a join: legal under stream capture). Events and the stream are
// made at construction; a run allocates nothing. Host backend: everything runs in order
// on the caller's stream (the same chunks, the same calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/streams.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt::detail {

/// Chunk sizes are multiples of this many elements (all but the last chunk), so that
/// every chunk starts 16-byte aligned for the sum's vector loads and NCCL's copies.
inline constexpr std::int64_t kPieceChunkAlign = 256;
/// The automatic rule: chunks of at least this many bytes per piece (NCCL's send/recv
/// is near its bandwidth from a few MiB on), and at most kMaxPieceChunks of them.
inline constexpr std::size_t kMinChunkPieceBytes = std::size_t{4} << 20;
inline constexpr int kMaxPieceChunks = 4;

/// How a piece of `count` elements is cut: `number` chunks of `size` elements, the last
/// one shorter when `count` is not a multiple (number <= the chunks asked for; 0 for an
/// empty piece).
struct PieceChunks {
  std::int64_t size = 0;
  int number = 0;
};

/// At most `chunks` (>= 1) chunks of a piece of `count` elements, each but the last a
/// multiple of kPieceChunkAlign elements.
PieceChunks piece_chunks(std::int64_t count, int chunks);

/// The chunks for a piece of `piece_bytes` when the caller asks for 0 (automatic):
/// piece_bytes / kMinChunkPieceBytes, clamped to [1, kMaxPieceChunks].
int auto_piece_chunks(std::size_t piece_bytes);

/// One bucket's reduce: `data` holds n pieces of `count` elements of `dtype` (piece r,
/// for rank r, at r * count); this rank's piece is read where it lies; `pieces` receives
/// the others (n * count elements of scratch, chunk-major: chunk k's pieces back to
/// back, at n * k * chunk size). `out` gets the fp32 sum in rank order (/ n for
/// `average`), rounded once to out_dtype; it may be this rank's piece of `data`.
struct PieceReduce {
  void* data = nullptr;
  void* pieces = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::bf16;
  bool average = false;
  void* out = nullptr;
  DType out_dtype = DType::bf16;
};

/// The sum stream and the events of a pipelined reduce of up to `max_chunks` chunks.
class PieceReducer {
 public:
  PieceReducer(Backend backend, int max_chunks);
  /// Enqueues `r` on `stream` (with `comm`, size >= 2) in at most `chunks` chunks
  /// (1 <= chunks <= max_chunks): afterwards the work queued on `stream` includes the
  /// whole reduce. Capturable.
  void run(const Communicator& comm, const PieceReduce& r, int chunks, Stream stream);
  int max_chunks() const noexcept { return static_cast<int>(moved_.size()); }

 private:
  Backend backend_;
  SideStream sum_;
  std::vector<Event> moved_;  // per chunk: its all-to-all is done
  Event summed_;              // the sum stream's last sum
};

}  // namespace shardopt::detail
