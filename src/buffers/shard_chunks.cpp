// shard_chunks: a rank's shard of one layout buffer as the fused Adam kernels' chunk
// table (the layout's segments, split by the kernels' split_shard_chunks).
#include <cstdint>
#include <vector>

#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"

namespace shardopt {

std::vector<ShardChunk> shard_chunks(const Layout& layout, int buffer, int rank, std::int64_t max_chunk) {
  (void)split_shard_chunks({}, max_chunk);  // a bad max_chunk is reported before a bad buffer or rank
  std::vector<ShardChunk> pieces;
  for (const Segment& seg : layout.segments(buffer, rank)) {
    ShardChunk piece;
    piece.shard_offset = seg.shard_offset;
    piece.buffer_offset = layout.params()[static_cast<std::size_t>(seg.param)].offset + seg.param_offset;
    piece.length = seg.length;
    piece.group = seg.group;
    pieces.push_back(piece);
  }
  return split_shard_chunks(pieces, max_chunk);
}

}  // namespace shardopt
