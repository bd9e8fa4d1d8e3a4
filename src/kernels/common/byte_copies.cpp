#include "kernels/common/byte_copies.hpp"

#include <cstring>

#include "core/check.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt::kernels {

void split_copy(std::vector<BytePiece>& table, const std::uint8_t* src, std::uint8_t* dst, std::int64_t bytes) {
  for (std::int64_t done = 0; done < bytes; done += kBytePieceMax) {
    const std::int64_t n = bytes - done < kBytePieceMax ? bytes - done : kBytePieceMax;
    table.push_back(BytePiece{src + done, dst + done, n});
  }
}

void copy_pieces(const BytePiece* pieces, std::int64_t count, Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(count >= 0, ErrorCode::Internal, "copy_pieces: negative piece count");
  if (count == 0) return;
  SHARDOPT_REQUIRE(pieces != nullptr, ErrorCode::Internal, "copy_pieces: no piece table");
  if (backend == Backend::Host) {
    host_enqueue(stream, [pieces, count] {
      for (std::int64_t i = 0; i < count; ++i) {
        const BytePiece& p = pieces[i];
        if (p.also == nullptr) {
          std::memcpy(p.dst, p.src, static_cast<std::size_t>(p.bytes));
        } else {
          for (std::int64_t k = 0; k < p.bytes; ++k) p.dst[k] = static_cast<std::uint8_t>(p.src[k] | p.also[k]);
        }
      }
    });
    return;
  }
  copy_pieces_cuda(pieces, count, stream);
}

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launch refuses.
void copy_pieces_cuda(const BytePiece*, std::int64_t, Stream) { detail::no_cuda("copy_pieces"); }
#endif

}  // namespace shardopt::kernels
