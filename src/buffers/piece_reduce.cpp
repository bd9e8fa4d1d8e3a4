#include "buffers/piece_reduce.hpp"

#include <algorithm>
#include <string>

#include "kernels/common/piece_sum.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

PieceChunks piece_chunks(std::int64_t count, int chunks) {
  SHARDOPT_REQUIRE(count >= 0 && chunks >= 1, ErrorCode::Internal,
                   "piece_chunks: " + std::to_string(count) + " elements in " + std::to_string(chunks) + " chunks");
  if (count == 0) return {};
  const std::int64_t even = (count + chunks - 1) / chunks;
  const std::int64_t size = (even + kPieceChunkAlign - 1) / kPieceChunkAlign * kPieceChunkAlign;
  return {size, static_cast<int>((count + size - 1) / size)};
}

int auto_piece_chunks(std::size_t piece_bytes) {
  return static_cast<int>(std::clamp<std::size_t>(piece_bytes / kMinChunkPieceBytes, 1, kMaxPieceChunks));
}

PieceReducer::PieceReducer(Backend backend, int max_chunks) : backend_(backend), sum_(backend), summed_(backend) {
  SHARDOPT_REQUIRE(max_chunks >= 1, ErrorCode::Internal, "PieceReducer: needs at least one chunk");
  moved_.reserve(static_cast<std::size_t>(max_chunks));
  for (int k = 0; k < max_chunks; ++k) moved_.emplace_back(backend);
}

void PieceReducer::run(const Communicator& comm, const PieceReduce& r, int chunks, Stream stream) {
  SHARDOPT_REQUIRE(chunks >= 1 && chunks <= max_chunks(), ErrorCode::Internal,
                   "PieceReducer::run: " + std::to_string(chunks) + " chunks, made for " +
                       std::to_string(max_chunks()));
  const PieceChunks c = piece_chunks(r.count, chunks);
  const int n = comm.size(), me = comm.rank();
  const std::size_t es = size_of(r.dtype), os = size_of(r.out_dtype);
  // One chunk: the sum follows the all-to-all on the caller's stream (no fork).
  const bool fork = backend_ == Backend::Cuda && c.number > 1;
  const Stream sum = fork ? sum_.get() : stream;
  auto* data = static_cast<char*>(r.data);
  auto* pieces = static_cast<char*>(r.pieces);
  for (int k = 0; k < c.number; ++k) {
    const std::int64_t at = k * c.size;
    const std::int64_t len = std::min(c.size, r.count - at);
    char* recv = pieces + static_cast<std::size_t>(n) * static_cast<std::size_t>(at) * es;
    comm.all_to_all_peers(data + static_cast<std::size_t>(at) * es, r.count, recv, len, len, r.dtype, stream);
    if (fork) {
      moved_[static_cast<std::size_t>(k)].record(stream);
      moved_[static_cast<std::size_t>(k)].wait(sum);
    }
    kernels::PieceSum s;
    s.pieces = recv;
    s.piece_dtype = r.dtype;
    s.n = n;
    s.count = len;
    s.average = r.average;
    s.own = data + (static_cast<std::size_t>(me) * static_cast<std::size_t>(r.count) + static_cast<std::size_t>(at)) * es;
    s.own_index = me;
    s.out = static_cast<char*>(r.out) + static_cast<std::size_t>(at) * os;
    s.out_dtype = r.out_dtype;
    s.share_sms = fork;
    kernels::piece_sum(s, backend_, sum);
  }
  if (fork) {
    summed_.record(sum);
    summed_.wait(stream);
  }
}

}  // namespace shardopt::detail
