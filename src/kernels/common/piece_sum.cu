#include <cstdint>

#include "core/check.hpp"
#include "kernels/common/piece_sum.hpp"
#include "kernels/common/piece_sum_math.cuh"

namespace shardopt::kernels {
namespace {

// One thread per element (grid-stride); the dtypes are template arguments so that the
// element math's switches fold away. `own` (piece own_index, or null) may be `out`: a
// thread reads its element of every piece before it writes it, and no other thread
// touches that element (so `out` and `own` are not __restrict__).
template <DType In, DType Out, bool Accumulate>
__global__ void piece_sum_kernel(const void* __restrict__ pieces, const void* own, int own_index, int n,
                                 std::int64_t count, bool average, void* out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    piece_sum_store(pieces, own, own_index, In, n, count, average, out, Out, Accumulate, i);
}

// bf16 pieces whose length and base allow 16-byte loads: each thread sums 8 adjacent
// elements, one uint4 per piece, with the element math of piece_sum_at (0.0f, then the
// pieces in rank order, then piece_sum_finish): the same bits as the scalar kernel.
template <DType Out, bool Accumulate>
__global__ void piece_sum_bf16x8_kernel(const uint4* __restrict__ pieces, const uint4* own, int own_index, int n,
                                        std::int64_t count8, bool average, void* out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < count8; v += stride) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = 0; r < n; ++r) {
      const uint4 word = r == own_index && own != nullptr ? own[v] : pieces[static_cast<std::int64_t>(r) * count8 + v];
      const std::uint32_t w[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
      for (int k = 0; k < 8; ++k)
        acc[k] += num::bf16_to_f32(static_cast<std::uint16_t>(w[k / 2] >> (16 * (k % 2))));
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) piece_sum_write(out, Out, Accumulate, v * 8 + k, piece_sum_finish(acc[k], n, average));
  }
}

// Blocks for `items` threads' work (256 a block), at most `cap`.
unsigned grid_for(std::int64_t items, unsigned cap) {
  const std::int64_t blocks = (items + 255) / 256;
  return static_cast<unsigned>(blocks < static_cast<std::int64_t>(cap) ? blocks : cap);
}

template <DType In, DType Out>
void launch3(const PieceSum& a, cudaStream_t s, unsigned cap) {
  if constexpr (In == DType::bf16) {
    if (a.count % 8 == 0 && reinterpret_cast<std::uintptr_t>(a.pieces) % 16 == 0 &&
        reinterpret_cast<std::uintptr_t>(a.own) % 16 == 0) {
    const std::int64_t count8 = a.count / 8;
    const unsigned g = grid_for(count8, cap);
    const auto* p = static_cast<const uint4*>(a.pieces);
    const auto* o = static_cast<const uint4*>(a.own);
    if (a.accumulate) {
      piece_sum_bf16x8_kernel<Out, true><<<g, 256, 0, s>>>(p, o, a.own_index, a.n, count8, a.average, a.out);
    } else {
      piece_sum_bf16x8_kernel<Out, false><<<g, 256, 0, s>>>(p, o, a.own_index, a.n, count8, a.average, a.out);
    }
    return;
    }
  }
  const unsigned grid = grid_for(a.count, cap);
  if (a.accumulate) {
    piece_sum_kernel<In, Out, true><<<grid, 256, 0, s>>>(a.pieces, a.own, a.own_index, a.n, a.count, a.average, a.out);
  } else {
    piece_sum_kernel<In, Out, false><<<grid, 256, 0, s>>>(a.pieces, a.own, a.own_index, a.n, a.count, a.average, a.out);
  }
}

template <DType In>
void launch2(const PieceSum& a, cudaStream_t s, unsigned cap) {
  switch (a.out_dtype) {
    case DType::f32: launch3<In, DType::f32>(a, s, cap); break;
    case DType::bf16: launch3<In, DType::bf16>(a, s, cap); break;
    case DType::f16: launch3<In, DType::f16>(a, s, cap); break;
    default: break;
  }
}

}  // namespace

void piece_sum_cuda(const PieceSum& a, Stream stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  unsigned cap = 8192;
  if (a.share_sms) {  // device queries, not stream work: fine under capture
    int device = 0, sms = 0;
    SHARDOPT_CUDA_CHECK(cudaGetDevice(&device));
    SHARDOPT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cap = static_cast<unsigned>(sms > 0 ? sms * kShareSmsBlocksPerSm : 8192);
  }
  switch (a.piece_dtype) {
    case DType::f32: launch2<DType::f32>(a, s, cap); break;
    case DType::bf16: launch2<DType::bf16>(a, s, cap); break;
    case DType::f16: launch2<DType::f16>(a, s, cap); break;
    default: break;
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels

// Every kernel of this file, for load_step_kernels: each kernel launch3<In, Out> can pick.
#include "kernels/common/kernel_files.hpp"

namespace shardopt::kernels {

void piece_sum_kernels_cuda(const KernelVisitor& visit) {
  auto out = [&]<DType In, DType Out>() {
    visit(kernel_symbol(piece_sum_kernel<In, Out, true>));
    visit(kernel_symbol(piece_sum_kernel<In, Out, false>));
    if constexpr (In == DType::bf16) {
      visit(kernel_symbol(piece_sum_bf16x8_kernel<Out, true>));
      visit(kernel_symbol(piece_sum_bf16x8_kernel<Out, false>));
    }
  };
  auto in = [&]<DType In>() {
    out.template operator()<In, DType::f32>();
    out.template operator()<In, DType::bf16>();
    out.template operator()<In, DType::f16>();
  };
  in.template operator()<DType::f32>();
  in.template operator()<DType::bf16>();
  in.template operator()<DType::f16>();
}

}  // namespace shardopt::kernels
