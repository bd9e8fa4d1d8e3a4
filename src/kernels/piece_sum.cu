#include "core/check.hpp"
#include "kernels/piece_sum.hpp"
#include "kernels/piece_sum_math.cuh"

namespace shardopt::kernels {
namespace {

// One thread per element (grid-stride); the dtypes are template arguments so that the
// element math's switches fold away.
template <DType In, DType Out, bool Accumulate>
__global__ void piece_sum_kernel(const void* __restrict__ pieces, int n, std::int64_t count, bool average,
                                 void* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    piece_sum_store(pieces, In, n, count, average, out, Out, Accumulate, i);
}

template <DType In, DType Out>
void launch3(const PieceSum& a, cudaStream_t s, unsigned grid) {
  if (a.accumulate) {
    piece_sum_kernel<In, Out, true><<<grid, 256, 0, s>>>(a.pieces, a.n, a.count, a.average, a.out);
  } else {
    piece_sum_kernel<In, Out, false><<<grid, 256, 0, s>>>(a.pieces, a.n, a.count, a.average, a.out);
  }
}

template <DType In>
void launch2(const PieceSum& a, cudaStream_t s, unsigned grid) {
  switch (a.out_dtype) {
    case DType::f32: launch3<In, DType::f32>(a, s, grid); break;
    case DType::bf16: launch3<In, DType::bf16>(a, s, grid); break;
    case DType::f16: launch3<In, DType::f16>(a, s, grid); break;
    default: break;
  }
}

}  // namespace

void piece_sum_cuda(const PieceSum& a, Stream stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const std::int64_t blocks = (a.count + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 8192 ? blocks : 8192);
  switch (a.piece_dtype) {
    case DType::f32: launch2<DType::f32>(a, s, grid); break;
    case DType::bf16: launch2<DType::bf16>(a, s, grid); break;
    case DType::f16: launch2<DType::f16>(a, s, grid); break;
    default: break;
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels
