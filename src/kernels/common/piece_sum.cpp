#include "kernels/common/piece_sum.hpp"

#include <string>

#include "core/check.hpp"
#include "kernels/common/piece_sum_math.cuh"
#include "shardopt/host_stream.hpp"

namespace shardopt::kernels {

void piece_sum_host(const PieceSum& a) {
  for (std::int64_t i = 0; i < a.count; ++i)
    piece_sum_store(a.pieces, a.own, a.own_index, a.piece_dtype, a.n, a.count, a.average, a.out, a.out_dtype,
                    a.accumulate, i);
}

void piece_sum(const PieceSum& a, Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(is_float_storage(a.piece_dtype) && is_float_storage(a.out_dtype), ErrorCode::InvalidArgument,
                   std::string("piece_sum: ") + to_string(a.piece_dtype) + " pieces into " + to_string(a.out_dtype) +
                       " is not between f32, bf16 and f16");
  SHARDOPT_REQUIRE(a.n >= 1, ErrorCode::InvalidArgument, "piece_sum: needs at least one piece");
  SHARDOPT_REQUIRE(a.count >= 0, ErrorCode::InvalidArgument, "piece_sum: negative element count");
  if (a.count == 0) return;
  SHARDOPT_REQUIRE(a.pieces != nullptr && a.out != nullptr, ErrorCode::InvalidArgument,
                   "piece_sum: null pieces or output");
  SHARDOPT_REQUIRE(a.own == nullptr || (a.own_index >= 0 && a.own_index < a.n), ErrorCode::InvalidArgument,
                   "piece_sum: own_index " + std::to_string(a.own_index) + " is not a piece of " + std::to_string(a.n) +
                       "; give the index in [0, n) of the piece `own` holds");
  if (backend == Backend::Host) {
    host_enqueue(stream, [a] { piece_sum_host(a); });
    return;
  }
  piece_sum_cuda(a, stream);
}

}  // namespace shardopt::kernels

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launch refuses.
namespace shardopt::kernels {
void piece_sum_cuda(const PieceSum&, Stream) { detail::no_cuda("the rank-ordered piece sum"); }
}  // namespace shardopt::kernels
#endif
