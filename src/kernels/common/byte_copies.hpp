// byte_copies.hpp - a table of byte copies run in one launch: how the landing of a
// quantized parameter format (MXFP8, NVFP4; src/quantized/quantized_params.hpp) moves
// every parameter's bytes from the all-gather staging (rank pieces in the gradient
// buffer) into the persistent storage.
//
// The table is built once on the host (split_copy cuts each copy into pieces of at most
// kBytePieceMax bytes so that one block per piece balances the launch) and kept in device
// memory; copy_pieces runs a contiguous sub-table, stream-ordered and capturable. The
// host twin (host backend) runs the same copies with memcpy.
#pragma once

#include <cstdint>
#include <vector>

#include "shardopt/backend.hpp"

namespace shardopt::kernels {

/// One copy of `bytes` bytes (the destination ranges of a table never overlap).
struct BytePiece {
  const std::uint8_t* src = nullptr;
  std::uint8_t* dst = nullptr;
  std::int64_t bytes = 0;
  /// When set, dst[i] = src[i] | also[i]: the NVFP4 byte two ranks share at an odd shard
  /// boundary, each having written its own nibble and 0 in the other.
  const std::uint8_t* also = nullptr;
};

/// Largest piece: one CUDA block copies one piece.
inline constexpr std::int64_t kBytePieceMax = std::int64_t{1} << 16;

/// Appends the copy src[0, bytes) -> dst[0, bytes) to `table`, cut into pieces of at most
/// kBytePieceMax bytes (nothing for bytes == 0).
void split_copy(std::vector<BytePiece>& table, const std::uint8_t* src, std::uint8_t* dst, std::int64_t bytes);

/// Runs the copies of pieces[0, count) (a table in the backend's device memory).
void copy_pieces(const BytePiece* pieces, std::int64_t count, Backend backend, Stream stream);

/// The CUDA launch (byte_copies.cu): one block of 256 threads per piece, 16-byte vector
/// body where source and destination are equally aligned, bytes otherwise. A build
/// without CUDA refuses it (Error(Unsupported)).
void copy_pieces_cuda(const BytePiece* pieces, std::int64_t count, Stream stream);

}  // namespace shardopt::kernels
