// piece_sum.hpp - the local half of a deterministic reduce-scatter: the n pieces an
// all-to-all delivered (one per rank, in rank order) summed in fp32, in rank order, into
// one output. Stream-ordered and capturable on either backend; the CUDA kernel and the
// host twin share the element math (piece_sum_math.cuh) and give the same bits.
#pragma once

#include <cstdint>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"

namespace shardopt::kernels {

/// What to sum and where to put it.
struct PieceSum {
  const void* pieces = nullptr;  ///< n pieces of `count` elements, piece r at r * count
  DType piece_dtype = DType::bf16;  ///< f32, bf16 or f16
  int n = 1;                        ///< pieces (ranks), >= 1
  std::int64_t count = 0;           ///< elements per piece
  bool average = false;             ///< divide the sum once by n
  void* out = nullptr;              ///< count elements, must not overlap the pieces
  DType out_dtype = DType::f32;     ///< f32, bf16 or f16: the sum rounded once to it
  bool accumulate = false;          ///< out[i] <- out[i] + sum (the add in fp32, rounded once)
  /// Piece `own_index` read here (count elements) instead of at pieces + own_index * count,
  /// e.g. this rank's piece where it already lies, so that no all-to-all copies it. It may
  /// be `out` itself (each element is read before it is written), no other overlap.
  /// Null: every piece in `pieces`.
  const void* own = nullptr;
  int own_index = -1;  ///< which piece `own` holds, in [0, n) when `own` is set
  /// CUDA: at most kShareSmsBlocksPerSm blocks per SM, leaving room on every SM for a
  /// kernel that runs beside the sum (the next chunk's all-to-all, docs/grad_reduce.md);
  /// false: one full wave of resident blocks (the occupancy API's count on every SM).
  /// The bits are the same.
  bool share_sms = false;
};

/// Blocks per SM of a sum launched with PieceSum::share_sms (256 threads each): at most
/// half of what the vector kernel can keep resident (3 or 4 blocks, 64 to 74 registers a
/// thread on sm_90), so half of every SM's registers and three quarters of its threads
/// stay free, while 2 x 256 threads with 64 bytes in flight each (2 pieces) keep about
/// 4 MB in flight on 132 SMs: HBM's bandwidth times its latency.
inline constexpr int kShareSmsBlocksPerSm = 2;

/// out[i] = sum_{r = 0..n-1} pieces[r][i] in fp32, left to right from 0.0f (then / n for
/// average), rounded once to out_dtype (added to out[i] first when accumulate). CUDA:
/// 16-byte vector loads and stores when the length is a multiple of 16 bytes of a piece
/// and `pieces`, `own` and `out` are aligned to them; element by element otherwise
/// (the same bits either way).
/// Error(InvalidArgument) for a dtype outside f32/bf16/f16, n < 1, a negative count, a
/// null pointer with count > 0, or `own` set with own_index outside [0, n).
void piece_sum(const PieceSum& args, Backend backend, Stream stream);

void piece_sum_cuda(const PieceSum& args, Stream stream);
/// The element loop of the host twin.
void piece_sum_host(const PieceSum& args);

}  // namespace shardopt::kernels
